"""Tests of the toy demo (`rlpure demo --model toy`, `shell.jobs.demo`): envs, datasets, the
base-model service, a tiny run. The default demo (SmolLM2) is tested in test_demo_smollm2.py.

The accuracy targets of the real recipe are measured by `benchmarks/bench_demo.py`, not here:
this file runs a deliberately tiny recipe (a few steps) to check the plumbing end to end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import jax
import msgspec
import pytest

from rlpure.model import ByteTokenizer
from rlpure.render import get_renderer
from rlpure.tasks import arithmetic as ar
from rlpure.tasks.arithmetic import ArithmeticProblem
from shell.env import EnvGroupBuilder
from shell.errors import ConfigError
from shell.fakes import FakeServiceClient
from shell.jobs import demo
from shell.jobs.demo import ArithmeticDataset, ArithmeticEnv, BaseModelServiceClient, DemoConfig

TOKENIZER = ByteTokenizer()
RENDERER = get_renderer("role_colon", TOKENIZER)

TINY = DemoConfig(
    max_operand=3,
    num_test=4,
    pretrain_steps=3,
    pretrain_batch=8,
    rl_steps=2,
    groups_per_batch=4,
    group_size=2,
    max_tokens=16,
    eval_every=1,
)


def _arithmetic_envs(builder: EnvGroupBuilder) -> list[ArithmeticEnv]:
    envs = asyncio.run(builder.make_envs())
    assert all(isinstance(env, ArithmeticEnv) for env in envs)
    return [env for env in envs if isinstance(env, ArithmeticEnv)]


def _step(env: ArithmeticEnv, text: str) -> tuple[float, dict[str, float]]:
    result = asyncio.run(env.step(list(TOKENIZER.encode(text, add_special_tokens=False))))
    return result.reward, dict(result.metrics)


def test_env_prompt_and_rewards() -> None:
    env = ArithmeticEnv(ArithmeticProblem(a=3, b=5), RENDERER, format_coef=0.1)
    prompt, stop = asyncio.run(env.initial_observation())
    assert TOKENIZER.decode(prompt.to_ints()) == "<|bos|>User: 3+5\n\nAssistant:"
    assert stop == ("\n\nUser:",)
    assert _step(env, " 8\n\nUser:") == (1.0, {"format": 1.0, "correct": 1.0})
    assert _step(env, " =8\n\nUser:") == (1.0, {"format": 1.0, "correct": 1.0})
    assert _step(env, " 9\n\nUser:") == (0.0, {"format": 1.0, "correct": 0.0})
    # right number, drifted format: not an answer under the strict grammar
    reward, metrics = _step(env, " 8\n\n\nUser:")
    assert metrics == {"format": 0.0, "correct": 0.0}
    assert reward == pytest.approx(-0.1)
    # truncated (no stop sequence): malformed, and not correct
    reward, metrics = _step(env, " 8\n\nUs")
    assert metrics["format"] == 0.0
    assert reward == pytest.approx(-0.1)
    assert env.get_reference_answer() == "8"


def test_dataset_batches_are_deterministic_distinct_and_from_the_pool() -> None:
    problems = ar.all_problems(max_operand=4)[:20]
    make = lambda seed: ArithmeticDataset(  # noqa: E731
        problems,
        RENDERER,
        num_batches=5,
        groups_per_batch=6,
        group_size=3,
        key=jax.random.key(seed),
    )
    dataset = make(0)
    assert len(dataset) == 5

    def questions(ds: ArithmeticDataset, index: int) -> list[str]:
        out = []
        for builder in ds.get_batch(index):
            envs = _arithmetic_envs(builder)
            assert len(envs) == 3
            assert len({env.get_question() for env in envs}) == 1  # one problem per group
            out.append(envs[0].get_question())
        return out

    first = questions(dataset, 0)
    assert len(set(first)) == 6
    assert set(first) <= {ar.problem_question(p) for p in problems}
    assert questions(make(0), 0) == first
    assert questions(dataset, 1) != first or questions(dataset, 2) != first
    with pytest.raises(IndexError):
        dataset.get_batch(5)


def test_evaluation_dataset_is_every_problem_once() -> None:
    problems = ar.all_problems(max_operand=2)
    dataset = ArithmeticDataset(
        problems, RENDERER, num_batches=1, groups_per_batch=len(problems), group_size=1, key=None
    )
    builders = dataset.get_batch(0)
    questions = [_arithmetic_envs(b)[0].get_question() for b in builders]
    assert questions == [ar.problem_question(p) for p in problems]


def test_dataset_rejects_too_many_groups() -> None:
    with pytest.raises(ValueError, match="groups_per_batch"):
        ArithmeticDataset(
            ar.all_problems(max_operand=1),
            RENDERER,
            num_batches=1,
            groups_per_batch=5,
            group_size=1,
            key=None,
        )


def test_pretraining_datum_weights_only_the_answer() -> None:
    datum = demo.pretraining_datum(RENDERER, "3+5", "=8")
    inputs = datum.model_input.to_ints()
    targets = datum.loss_fn_inputs["target_tokens"].to_numpy().tolist()
    weights = datum.loss_fn_inputs["weights"].to_numpy()
    assert inputs[1:] == targets[:-1]
    trained = TOKENIZER.decode([t for t, w in zip(targets, weights, strict=True) if w > 0])
    assert trained == " =8\n\nUser:"


def test_base_model_service_refuses_another_model() -> None:
    service = BaseModelServiceClient(
        FakeServiceClient(), base_model="rlpure/tiny", base_state_path="/x"
    )
    with pytest.raises(ValueError, match="rlpure/small"):
        service.create_lora_training_client("rlpure/small")


def test_demo_config_validation() -> None:
    with pytest.raises(ValueError, match=r"DemoConfig\.rl_steps"):
        DemoConfig(rl_steps=0)
    with pytest.raises(ValueError, match=r"DemoConfig\.rl_lr"):
        DemoConfig(rl_lr=0.0)


def test_demo_command_is_registered() -> None:
    from shell.jobs import COMMANDS

    assert "demo" in COMMANDS
    parser = argparse.ArgumentParser()
    demo.add_demo_arguments(parser)
    args = parser.parse_args(["--seed", "3", "--log-dir", "x", "--rl-steps", "5"])
    assert (args.seed, args.log_dir, args.rl_steps) == (3, Path("x"), 5)


def _test_accuracies(log_dir: Path) -> list[tuple[int, float]]:
    lines = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["test/env/all/correct"]) for r in lines if "test/env/all/correct" in r]


@pytest.mark.slow
def test_tiny_demo_writes_its_files_and_is_deterministic(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    summary = demo.run_demo(
        seed=0, log_dir=tmp_path / "a", config=TINY, cache_dir=cache, progress=False
    )
    for name in ("metrics.jsonl", "reward_curve.png", "summary.json", "pretrain_metrics.jsonl"):
        assert (tmp_path / "a" / name).is_file(), name
    # the run records of issue 13: rollout reports, logs.log, timing spans, token counts
    for name in ("logs.log", "timing_spans.jsonl", "iteration_000000/train.html",
                 "iteration_000000/train_rollout_summaries.jsonl", "iteration_000000/eval_test.html"):  # fmt: skip
        assert (tmp_path / "a" / name).is_file(), name
    first = json.loads((tmp_path / "a" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["tokens/sampled"] > 0 and first["tokens/cumulative/trained"] > 0
    on_disk = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert on_disk == summary
    for key in ("seed", "accuracy_before", "accuracy_after", "steps", "wall_s"):
        assert key in summary
    assert summary["seed"] == 0
    assert summary["steps"] == TINY.rl_steps
    assert 0.0 <= summary["accuracy_before"] <= 1.0
    assert 0.0 <= summary["accuracy_after"] <= 1.0
    assert summary["pretrain_cached"] is False
    assert summary["num_test_problems"] == TINY.num_test
    # evaluation before step 0, after each step (eval_every=1) and the final one
    assert [step for step, _ in _test_accuracies(tmp_path / "a")] == [0, 1, 2]

    again = demo.run_demo(
        seed=0, log_dir=tmp_path / "b", config=TINY, cache_dir=cache, progress=False
    )
    assert again["pretrain_cached"] is True
    assert again["accuracy_before"] == summary["accuracy_before"]
    assert again["accuracy_after"] == summary["accuracy_after"]
    rewards = [
        [json.loads(line).get("env/all/reward/total") for line in f.read_text().splitlines()]
        for f in (tmp_path / "a" / "metrics.jsonl", tmp_path / "b" / "metrics.jsonl")
    ]
    assert rewards[0] == rewards[1]

    # Resuming the finished run with the same recipe does nothing; with another recipe it is
    # refused (naming the option) before any pretraining, and the run's files are untouched.
    resumed = demo.run_demo(
        seed=0, log_dir=tmp_path / "a", config=TINY, cache_dir=cache, progress=False
    )
    assert resumed["resumed_from_step"] == TINY.rl_steps
    metrics_before = (tmp_path / "a" / "metrics.jsonl").read_bytes()
    changed = msgspec.structs.replace(TINY, group_size=TINY.group_size + 1)
    with pytest.raises(ConfigError, match=r"recipe option group_size"):
        demo.run_demo(
            seed=0, log_dir=tmp_path / "a", config=changed, cache_dir=cache, progress=False
        )
    assert (tmp_path / "a" / "metrics.jsonl").read_bytes() == metrics_before


def test_the_base_model_cache_survives_a_move_and_a_torn_record(tmp_path: Path) -> None:
    from shell.jobs.demo import pretrain_base_model
    from shell.jobs.demo._base_model import _pretrain_cache_key

    problems = [ArithmeticProblem(a=1, b=2), ArithmeticProblem(a=2, b=2)]

    def pretrain(cache: Path) -> demo.PretrainResult:
        return asyncio.run(
            pretrain_base_model(config=TINY, seed=0, corpus_problems=problems, cache_dir=cache)
        )

    first = pretrain(tmp_path / "a" / "base_model")
    assert not first.cached
    (tmp_path / "a").rename(tmp_path / "b")
    moved = pretrain(tmp_path / "b" / "base_model")
    assert moved.cached and Path(moved.state_path).is_relative_to(tmp_path / "b")
    record = tmp_path / "b" / "base_model" / _pretrain_cache_key(TINY, 0) / "base_model.json"
    record.write_text('{"state_path": "st')  # torn by a kill in an older version
    rebuilt = pretrain(tmp_path / "b" / "base_model")
    assert not rebuilt.cached
    assert json.loads(record.read_text())["final_loss_per_token"] == rebuilt.final_loss_per_token


@pytest.mark.slow
def test_a_demo_killed_during_grpo_resumes_losing_at_most_save_every_steps(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    log_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "shell.cli", "demo", "--model", "toy", "--log-dir", str(log_dir),
            "--quiet", "--pretrain-steps", "20", "--rl-steps", "30", "--save-every", "5",
            "--groups-per-batch", "2", "--group-size", "2"]  # fmt: skip
    metrics = log_dir / "metrics.jsonl"

    def steps_logged() -> list[int]:
        if not metrics.exists():
            return []
        steps = []
        for line in metrics.read_text().splitlines():
            try:
                steps.append(json.loads(line)["step"])
            except json.JSONDecodeError:  # the line being written when the poll read it
                continue
        return steps

    repo = Path(__file__).resolve().parents[2]
    run = subprocess.Popen(argv, cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while len(steps_logged()) < 13 and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(run.pid, signal.SIGKILL)
    run.wait()
    done = max(steps_logged()) + 1
    assert 13 <= done < 30, done  # killed during GRPO, not after it
    saved = [json.loads(line)["step"] for line in (log_dir / "checkpoints.jsonl").open()]
    assert done - max(saved) <= 5

    finished = subprocess.run(argv, cwd=repo, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    summary = json.loads((log_dir / "summary.json").read_text())
    assert summary["resumed_from_step"] == max(saved)
    train_steps = [s for s in steps_logged() if s < 30]
    assert train_steps == list(range(30))  # each step once: the lost ones were redone
