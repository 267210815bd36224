"""The demo's run: base model, then GRPO through the shared loop, then `summary.json`.

Part of `rlpure demo` (see `shell.jobs.demo` for the recipe). `run_demo_async` splits the
problems, gets the base model (`_base_model`), and runs `shell.training.train` on the local
backend with the arithmetic datasets (`_arithmetic`); the loop writes
`metrics.jsonl`, `samples.jsonl` and `reward_curve.png`, this module writes
`pretrain_metrics.jsonl` (through the base-model stage) and `summary.json`. Accuracies in the
summary are held-out greedy accuracies (`test/env/all/correct`) read back from
`metrics.jsonl`: "before" from the step-0 evaluation, "after" from the final one; `None` when
the log has no such record.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import jax
import msgspec

from rlpure.model import ByteTokenizer
from rlpure.render import Renderer, get_renderer
from rlpure.tasks import arithmetic
from shell.config import TrainConfig
from shell.jobs.demo._arithmetic import ArithmeticDataset
from shell.jobs.demo._base_model import (
    BaseModelServiceClient,
    PretrainResult,
    pretrain_base_model,
)
from shell.jobs.demo._config import DemoConfig, demo_keys
from shell.training import (
    METRICS_FILE,
    TrainResult,
    checked_last_checkpoint,
    eval_metric_before_after,
    finite_json,
    recipe_options,
    train,
)

__all__ = [
    "DEMO_RESUME_MAY_CHANGE",
    "PRETRAIN_METRICS_FILE",
    "SUMMARY_FILE",
    "demo_recipe_options",
    "run_demo",
    "run_demo_async",
]

SUMMARY_FILE = "summary.json"
"""Accuracy before and after GRPO, the time split and the recipe, in the log dir."""
PRETRAIN_METRICS_FILE = "pretrain_metrics.jsonl"
"""One JSON object per base-model pretraining step, in the log dir."""


DEMO_RESUME_MAY_CHANGE = frozenset({"rl_steps", "eval_every"})
"""DemoConfig fields a resumed demo run may change (how long it runs, how often it evaluates)."""


def demo_recipe_options(config: DemoConfig) -> dict[str, Any]:
    """The demo's options recorded for the resume check: every `DemoConfig` field that shapes
    the run (the split, the corpus, the base model, the batches, the reward)."""
    return recipe_options("demo", msgspec.to_builtins(config), may_change=DEMO_RESUME_MAY_CHANGE)


async def run_demo_async(
    *,
    seed: int,
    log_dir: Path,
    config: DemoConfig | None = None,
    cache_dir: Path | None = None,
    progress: bool = True,
    save_every: int = 0,
) -> dict[str, Any]:
    """Runs the demo (see the module docstring) and writes `summary.json`; returns it.

    Args:
        seed: seeds the split, the corpus, the base model, sampling and the loop.
        log_dir: where the run's files go (created).
        config: the recipe (default `DemoConfig()`).
        cache_dir: base-model cache (default `<log_dir>/base_model`).
        progress: print the loop's per-step lines.
        save_every: checkpoint GRPO every N steps (`TrainConfig.save_every`; 0: at the end).
    """
    from shell.local import LocalServiceClient

    start = time.perf_counter()
    config = config or DemoConfig()
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    cache_dir = Path(cache_dir) if cache_dir is not None else log_dir / "base_model"
    train_config = _demo_train_config(
        config, seed=seed, log_dir=log_dir, save_every=save_every, progress=progress
    )
    recipe_options = demo_recipe_options(config)
    # Refuse a resume with another recipe before the (cached, but maybe 30 s) pretraining.
    checked_last_checkpoint(train_config, recipe_options=recipe_options)
    keys = demo_keys(seed)
    split = arithmetic.split_problems(
        keys["split"], max_operand=config.max_operand, num_test=config.num_test
    )
    base = await pretrain_base_model(
        config=config,
        seed=seed,
        corpus_problems=arithmetic.all_problems(max_operand=config.max_operand),
        cache_dir=cache_dir,
        metrics_path=log_dir / PRETRAIN_METRICS_FILE,
    )
    tokenizer = ByteTokenizer()
    dataset, test_dataset = _demo_datasets(
        split, get_renderer("role_colon", tokenizer), config=config, key=keys["rl"]
    )
    service = BaseModelServiceClient(
        LocalServiceClient(seed=seed, checkpoint_dir=log_dir / "local_states"),
        base_model=config.base_model,
        base_state_path=base.state_path,
    )
    rl_start = time.perf_counter()
    result = await train(
        train_config,
        dataset=dataset,
        test_dataset=test_dataset,
        service_client=service,
        tokenizer=tokenizer,
        recipe_options=recipe_options,
    )
    rl_seconds = time.perf_counter() - rl_start
    before, after = eval_metric_before_after(log_dir / METRICS_FILE, "test/env/all/correct")
    summary = _demo_summary(
        seed,
        config,
        result,
        base,
        split,
        wall_s=time.perf_counter() - start,
        rl_seconds=rl_seconds,
        before=before,
        after=after,
    )
    (log_dir / SUMMARY_FILE).write_text(finite_json(summary, indent=2) + "\n")
    return summary


def _demo_summary(
    seed: int,
    config: DemoConfig,
    result: TrainResult,
    base: PretrainResult,
    split: arithmetic.ProblemSplit,
    *,
    wall_s: float,
    rl_seconds: float,
    before: float | None,
    after: float | None,
) -> dict[str, Any]:
    """The `summary.json` record: accuracies, steps, the time split and the recipe."""
    ran = result.end_step - result.start_step
    return {
        "seed": seed,
        "accuracy_before": before,
        "accuracy_after": after,
        "steps": result.end_step,
        "resumed_from_step": result.start_step,
        "wall_s": round(wall_s, 2),
        "pretrain_s": round(base.seconds, 2),
        "pretrain_cached": base.cached,
        "pretrain_final_loss_per_token": base.final_loss_per_token,
        "rl_s": round(rl_seconds, 2),
        "rl_steps_per_s": round(ran / rl_seconds, 3) if ran and rl_seconds > 0 else None,
        "num_train_problems": len(split.train),
        "num_test_problems": len(split.test),
        "reward_curve": result.reward_curve,
        "recipe": msgspec.to_builtins(config),
    }


def _demo_train_config(
    config: DemoConfig, *, seed: int, log_dir: Path, save_every: int, progress: bool
) -> TrainConfig:
    """The GRPO stage's `TrainConfig`: local backend, importance sampling, greedy evaluation."""
    return TrainConfig(
        log_dir=str(log_dir),
        backend="local",
        base_model=config.base_model,
        seed=seed,
        max_steps=config.rl_steps,
        learning_rate=config.rl_lr,
        adam_eps=1e-8,
        loss_fn="importance_sampling",
        max_tokens=config.max_tokens,
        temperature=1.0,
        advantage_estimator="group_centered",
        eval_every=config.eval_every,
        eval_temperature=0.0,  # the summary reports held-out *greedy* accuracy
        save_every=save_every,
        progress=progress,
    )


def _demo_datasets(
    split: arithmetic.ProblemSplit, renderer: Renderer, *, config: DemoConfig, key: jax.Array
) -> tuple[ArithmeticDataset, ArithmeticDataset]:
    """The training dataset (`rl_steps` batches, groups keyed by `key`) and the held-out one
    (every test problem once, in one batch)."""
    dataset = ArithmeticDataset(
        split.train,
        renderer,
        num_batches=config.rl_steps,
        groups_per_batch=min(config.groups_per_batch, len(split.train)),
        group_size=config.group_size,
        key=key,
        format_coef=config.format_coef,
    )
    test_dataset = ArithmeticDataset(
        split.test,
        renderer,
        num_batches=1,
        groups_per_batch=len(split.test),
        group_size=1,
        key=None,
        format_coef=config.format_coef,
    )
    return dataset, test_dataset


def run_demo(
    *,
    seed: int,
    log_dir: Path,
    config: DemoConfig | None = None,
    cache_dir: Path | None = None,
    progress: bool = True,
    save_every: int = 0,
) -> dict[str, Any]:
    """`run_demo_async` in a fresh event loop (for scripts and benchmarks)."""
    return asyncio.run(
        run_demo_async(
            seed=seed,
            log_dir=log_dir,
            config=config,
            cache_dir=cache_dir,
            progress=progress,
            save_every=save_every,
        )
    )
