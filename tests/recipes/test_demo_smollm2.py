"""`rlpure demo`'s default, SmolLM2-135M-Instruct on worked addition: the grammar, the prompt and
rewards, the command's wiring of `--model` and its knobs, and one tiny GRPO step end to end.

The measured accuracies and times live in `shell.jobs.smollm2` and benchmarks/bench_demo.py;
these tests pin what the recipe is, at CI's cost.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
from pathlib import Path
from typing import Any

import jax
import msgspec
import pytest

from rlpure.render import get_renderer
from rlpure.tasks import arithmetic
from rlpure.tasks.arithmetic import ArithmeticProblem
from rlpure.tasks.worked_addition import grade_worked_response, parse_worked_answer
from shell.errors import ConfigError
from shell.jobs import demo, smollm2
from shell.jobs.smollm2 import DEMO_OPTIONS, AdditionDataset, addition_prefix
from shell.local._models import PACKAGED_MODELS


def _require_smollm2() -> None:
    packaged = PACKAGED_MODELS[smollm2.SMOLLM2_MODEL]
    if importlib.util.find_spec(packaged.package) is None:
        pytest.skip(f"{packaged.package} is not installed (make install adds it)")


@pytest.mark.parametrize(
    ("response", "answer"),
    [("3+5=8", 8), ("3+5=9", 9), ("3+5=-1", -1), ("8", None), ("=8", None), ("5+3=8", None),
     ("3 + 5 = 8", None), ("3+5=8.", None), ("3+5=08", None), ("3+5=", None), ("3+5", None),
     ("3+5==8", None), ("3+5=8\n", None), ("", None)],
)  # fmt: skip
def test_the_worked_grammar_takes_only_the_question_written_out_with_its_result(
    response: str, answer: int | None
) -> None:
    problem = ArithmeticProblem(a=3, b=5)
    assert parse_worked_answer(response, problem) == answer
    assert grade_worked_response(response, problem) == (answer == 8)


def test_the_worked_split_holds_out_problems_and_drops_the_shown_ones() -> None:
    split = smollm2.addition_split(jax.random.key(0), max_operand=9, num_test=50, worked=True)
    questions = [arithmetic.problem_question(p) for p in split.train + split.test]
    assert len(questions) == len(set(questions)) == 100 - len(smollm2.WORKED_FEWSHOT)
    assert not {q for q, _ in smollm2.WORKED_FEWSHOT} & set(questions)
    assert len(split.test) >= 45  # about 48 held-out problems, never trained on


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo.add_demo_arguments(parser)
    return parser.parse_args(argv)


def test_the_demo_runs_smollm2_by_default_with_its_knobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def fake_run(config: Any, *, options: Any) -> dict[str, Any]:
        seen.update(config=config, options=options)
        return {"seed": config.seed, "accuracy_before": 0.1, "accuracy_after": 0.9,
                "steps": config.max_steps, "wall_s": 1.0}  # fmt: skip

    monkeypatch.setattr(smollm2, "run_smollm2_demo", fake_run)
    args = _parse(["--seed", "2", "--log-dir", str(tmp_path / "run")])
    assert args.model == "smollm2"
    assert demo.demo_main(args) == 0
    config = seen["config"]
    assert (config.seed, config.log_dir, config.base_model) == (
        2, str(tmp_path / "run"), smollm2.SMOLLM2_MODEL)  # fmt: skip
    assert config.max_steps == smollm2.DEMO_CONFIG_DEFAULTS["max_steps"]
    assert config.eval_temperature == 0.0  # held-out accuracy is greedy
    assert seen["options"] == DEMO_OPTIONS and DEMO_OPTIONS.worked

    argv = ["--log-dir", str(tmp_path / "b"), "--rl-steps", "2", "--rl-lr", "2e-4",
            "--groups-per-batch", "3", "--group-size", "5", "--quiet", "--save-every", "1"]  # fmt: skip
    demo.demo_main(_parse(argv))
    config, options = seen["config"], seen["options"]
    assert (config.max_steps, config.learning_rate, config.progress, config.save_every) == (
        2, 2e-4, False, 1)  # fmt: skip
    assert (options.groups_per_batch, options.group_size) == (3, 5)
    assert options == msgspec.structs.replace(DEMO_OPTIONS, groups_per_batch=3, group_size=5)


def test_the_toy_demo_is_one_flag_away(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_run_demo(**kwargs: Any) -> dict[str, Any]:
        seen.update(kwargs)
        return {"seed": 0, "accuracy_before": 0.0, "accuracy_after": 1.0, "steps": 3,
                "wall_s": 1.0}  # fmt: skip

    monkeypatch.setattr(demo, "run_demo", fake_run_demo)
    monkeypatch.chdir(tmp_path)
    demo.demo_main(_parse(["--model", "toy", "--rl-steps", "3", "--pretrain-steps", "7"]))
    assert seen["log_dir"] == Path("runs/demo-toy-seed0")
    assert (seen["config"].rl_steps, seen["config"].pretrain_steps) == (3, 7)
    assert seen["config"].group_size == demo.DemoConfig().group_size


@pytest.mark.parametrize("flag", [["--cache-dir", "c"], ["--pretrain-steps", "3"]])
def test_toy_only_options_are_refused_for_smollm2(tmp_path: Path, flag: list[str]) -> None:
    with pytest.raises(ConfigError, match=f"demo {flag[0]}: only with --model toy"):
        demo.demo_main(_parse(["--log-dir", str(tmp_path / "run"), *flag]))
    with pytest.raises(ConfigError, match="demo --group-size: must be >= 1, got 0"):
        demo.demo_main(_parse(["--log-dir", str(tmp_path / "run"), "--group-size", "0"]))
    assert not (tmp_path / "run").exists()


def test_the_worked_prompt_and_its_rewards() -> None:
    _require_smollm2()
    from shell.tokenizers import get_tokenizer

    tokenizer = get_tokenizer(smollm2.SMOLLM2_MODEL)
    dataset = AdditionDataset(
        [ArithmeticProblem(a=3, b=5)],
        get_renderer("smollm2", tokenizer),
        num_batches=1,
        groups_per_batch=1,
        group_size=1,
        key=None,
        convo_prefix=addition_prefix(worked=True),
        format_coef=0.1,
        worked=True,
    )
    (group,) = dataset.get_batch(0)
    (env,) = asyncio.run(group.make_envs())
    assert isinstance(env, smollm2.AdditionEnv)
    prompt, _ = asyncio.run(env.initial_observation())
    text = tokenizer.decode(list(prompt.to_ints()))
    assert text.startswith("<|im_start|>system\nAnswer the sum.<|im_end|>\n")
    examples = "".join(
        f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>\n"
        for q, a in (("2+3", "2+3=5"), ("6+7", "13"), ("4+0", "4+0=4"), ("1+8", "9"))
    )
    assert examples in text
    assert text.endswith("<|im_start|>user\n3+5<|im_end|>\n<|im_start|>assistant\n")

    def step(reply: str) -> tuple[float, dict[str, float]]:
        tokens = tokenizer.encode(reply, add_special_tokens=False)
        result = asyncio.run(env.step(list(tokens)))
        return result.reward, dict(result.metrics)

    assert step("3+5=8<|im_end|>") == (1.0, {"format": 1.0, "correct": 1.0})
    reward, metrics = step("8<|im_end|>")  # right, but bare: malformed
    assert metrics == {"format": 0.0, "correct": 0.0} and reward == pytest.approx(-0.1)
    assert step("3+5=9<|im_end|>") == (0.0, {"format": 1.0, "correct": 0.0})
    reward, metrics = step("5+3=8<|im_end|>")  # another question's equation: malformed
    assert metrics == {"format": 0.0, "correct": 0.0} and reward == pytest.approx(-0.1)
    reward, metrics = step("3+5=8")  # truncated: no <|im_end|>
    assert metrics["format"] == 0.0


@pytest.mark.slow
def test_one_tiny_demo_step_writes_the_summary_curves_and_pages(tmp_path: Path) -> None:
    _require_smollm2()
    log_dir = tmp_path / "run"
    config = smollm2.smollm2_demo_config(seed=0, log_dir=log_dir, steps=1, progress=False)
    options = msgspec.structs.replace(DEMO_OPTIONS, num_test=3, groups_per_batch=2, group_size=2)
    summary = smollm2.run_smollm2_demo(config, options=options)
    assert json.loads((log_dir / "summary.json").read_text()) == summary
    assert summary["steps"] == 1 and summary["recipe"]["worked"] is True
    assert summary["num_test_problems"] == 3
    for value in (summary["accuracy_before"], summary["accuracy_after"]):
        assert 0.0 <= value <= 1.0
    for name in ("metrics.jsonl", "reward_curve.png", "iteration_000000/train.html",
                 "iteration_000000/eval_test.html"):  # fmt: skip
        assert (log_dir / name).is_file(), name
