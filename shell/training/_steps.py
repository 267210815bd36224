"""The parts of a step every mode shares: its start, the policy update, its record.

Each mode of `shell.training._loop.train` (the sync step `_sync`, the streaming step
`_stream`, the async loop `_async`) runs a step as:

1. `begin_step`: one split of the loop's PRNG key (the step's sampling seed is drawn from it),
   the step's first metrics (`progress/batch` or the async mode's `training_client/step`,
   `optim/lr`, `progress/done_frac`) and, when `eval_every` divides the step, every evaluator
   on the current sampler (`run_evaluators`: the evaluators' metrics, then the test set's);
2. its own rollouts; `record_rollouts` writes the step's rollout pages
   (`iteration_NNNNNN/train.html`, `train_rollout_summaries.jsonl`);
3. the update: `update_policy` (`train_on_groups` timed as the cookbook's
   `do_train_step_and_get_sampling_client`) and `update_metrics` (its metrics and the step's
   token counts), or the streaming mode's minibatches;
4. `finish_step`: its samples, its metrics row (file, trackers), its progress line, then its
   checkpoint when due (`save_checkpoint_due`, timed as `save_checkpoint_async`), then its
   `timing_spans.jsonl` row (with the checkpoint's span, which the metrics row, written first
   so that a run killed while saving keeps the step's row, does not hold) and, when
   `span_chart_every` divides the step, their Gantt chart (`iteration_NNNNNN/timing_gantt.html`).

Evaluation seeds: the test-set evaluation at step `i` samples with a seed derived from
`config.seed` and `i` alone (`eval_seed`), so evaluating changes no training seed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple

import jax

from rlpure.records import TrajectoryGroup
from shell.clients import SamplingClient
from shell.completion import TinkerTokenCompleter
from shell.config import TrainConfig
from shell.env import EnvGroupBuilder
from shell.plots import write_span_gantt_html
from shell.timing import StepTimer, recording, span, span_dicts
from shell.training._checkpoints import CheckpointRecord, prng_key_data
from shell.training._logs import (
    STEPS_LOGGER,
    JsonlWriter,
    RunProgress,
    decode_rollout_samples,
    format_progress_line,
)
from shell.training._policy_update import PolicyUpdate, train_on_groups
from shell.training._rollout_pages import iteration_dir, write_rollout_report
from shell.training._run import RunContext, RunState, TokenTotals, count_tokens
from shell.training._trackers import Trackers

__all__ = [
    "GANTT_FILE",
    "RunLogs",
    "StepResult",
    "StepStart",
    "StepsDone",
    "begin_step",
    "eval_seed",
    "evaluates",
    "finish_step",
    "record_rollouts",
    "run_evaluators",
    "save_checkpoint_due",
    "update_metrics",
    "update_policy",
    "write_spans",
]

step_logger = logging.getLogger(STEPS_LOGGER)


class StepStart(NamedTuple):
    """What `begin_step` returns.

    Attributes:
        metrics: the step's first metrics (evaluators' included when they ran).
        key: the loop's PRNG key after the step's split.
        step_key: the step's half of the split, from which its sampling seed is drawn.
    """

    metrics: dict[str, Any]
    key: jax.Array
    step_key: jax.Array

    @property
    def seed(self) -> int:
        """The step's sampling seed (sampler call `n` of the step uses `seed + n`), drawn
        from `step_key` by the modes that sample with it (not the async mode, whose groups
        have their own seeds)."""
        return int(jax.random.randint(self.step_key, (), 0, 2**31 - 1))


class StepResult(NamedTuple):
    """What a step of the sync or streaming mode returns.

    Attributes:
        metrics: the step's metrics (without its `time/*`, which the loop adds).
        groups: the step's successful groups (empty: a skipped step).
        state: the run's state after the step.
    """

    metrics: dict[str, Any]
    groups: list[TrajectoryGroup]
    state: RunState


GANTT_FILE = "timing_gantt.html"
"""A charted step's span Gantt page, in its `iteration_NNNNNN/` (the cookbook's name)."""


class RunLogs(NamedTuple):
    """The run's open writers, where `finish_step` records a step."""

    metrics: JsonlWriter
    samples: JsonlWriter
    spans: JsonlWriter
    trackers: Trackers
    progress: RunProgress


class StepsDone(NamedTuple):
    """What a mode's steps leave for the end of the run.

    Attributes:
        state: the run's state after its last step.
        last_metrics: the metrics of the last step run (empty if none ran).
        skipped: steps that trained on nothing because every group failed.
        ran_out_at: the step the data ran out at, before the run's last (async mode: steps
            from there on never ran); None when every step ran.
    """

    state: RunState
    last_metrics: dict[str, Any]
    skipped: tuple[int, ...]
    ran_out_at: int | None = None


_EVAL_STREAM = 0x6576616C
"""Folded into the run's seed to derive evaluation seeds (so evaluating draws nothing from the
loop's key: the training seeds of a run are the same with or without evaluation)."""


def eval_seed(seed: int, step: int) -> int:
    """The sampling seed of the evaluation at `step` (deterministic, as the training seeds)."""
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), _EVAL_STREAM), step)
    return int(jax.random.randint(key, (), 0, 2**31 - 1))


def evaluates(ctx: RunContext) -> bool:
    """Whether the run evaluates at all (`eval_every` and something to evaluate)."""
    return bool(ctx.config.eval_every) and (bool(ctx.evaluators) or ctx.test_evaluator is not None)


async def _timed_evaluation(
    call: Callable[[], Awaitable[Mapping[str, float]]],
) -> Mapping[str, float]:
    with span("run_single_evaluation"):
        return await call()  # made here: a run stopped before this task starts leaves none


async def run_evaluators(ctx: RunContext, sampler: SamplingClient, step: int) -> dict[str, float]:
    """Every evaluator on `sampler` (the current sampling client), concurrently; metrics merged
    in order (a later evaluator's key wins; the test-set evaluator is last), as the cookbook's
    `run_evaluations_parallel`. Spans: `run_evals` and `run_evaluations_parallel` around the
    whole, `run_single_evaluation` per evaluator (the cookbook's)."""
    calls: list[Callable[[], Awaitable[Mapping[str, float]]]] = [
        partial(evaluator, sampler) for evaluator in ctx.evaluators
    ]
    if ctx.test_evaluator is not None:
        calls.append(partial(ctx.test_evaluator, sampler, seed=eval_seed(ctx.config.seed, step)))
    merged: dict[str, float] = {}
    with span("run_evals"), span("run_evaluations_parallel"):
        for found in await asyncio.gather(*(_timed_evaluation(call) for call in calls)):
            merged.update(found)
    evaluated = getattr(ctx.test_evaluator, "last_groups", ())  # see shell.training._rollout_pages
    if ctx.test_evaluator is not None and evaluated:
        write_rollout_report(
            ctx.log_dir,
            step=step,
            groups_P=[group for group, _ in evaluated],
            tags_P=[tags for _, tags in evaluated],
            decode=ctx.decode,
            num_groups_to_log=ctx.config.num_groups_to_log,
            base_name=f"eval_{ctx.test_evaluator.name}",
            split=f"eval/{ctx.test_evaluator.name}",
            title=f"Running evaluation {ctx.test_evaluator.name} {step}",
            export_summaries=ctx.config.rollout_json_export,
        )
    return merged


def sampling_policy(
    config: TrainConfig, sampling_client: SamplingClient, *, seed: int
) -> TinkerTokenCompleter:
    """The policy rollouts sample with, in every mode: `sampling_client` at the run's
    `max_tokens` and `temperature`; its sampler call `n` uses `seed + n` (a step's seed in the
    sync and streaming modes, a group's in the async mode)."""
    return TinkerTokenCompleter(
        sampling_client,
        max_tokens=config.max_tokens,
        temperature=config.temperature,
        seed=seed,
    )


async def begin_step(
    ctx: RunContext, state: RunState, step: int, *, step_metric: str = "progress/batch"
) -> StepStart:
    """The start every mode's step shares (see the module docstring, 1.).

    Args:
        ctx: the run's context.
        state: the run's state before the step (its key is split, its sampler evaluated).
        step: the step's index.
        step_metric: the metric naming the step (`"training_client/step"` in the async mode,
            as the cookbook's).
    """
    config = ctx.config
    key, step_key = jax.random.split(state.key)
    metrics: dict[str, Any] = {
        step_metric: step,
        "optim/lr": config.learning_rate,
        "progress/done_frac": (step + 1) / ctx.num_steps,
    }
    if evaluates(ctx) and step % config.eval_every == 0:
        metrics.update(await run_evaluators(ctx, state.sampling_client, step))
    return StepStart(metrics=metrics, key=key, step_key=step_key)


def record_rollouts(
    ctx: RunContext,
    step: int,
    groups_P: Sequence[TrajectoryGroup],
    builders_P: Sequence[EnvGroupBuilder],
) -> None:
    """The step's rollout pages (`iteration_NNNNNN/train.html`, `train_rollout_summaries.jsonl`;
    `shell.training._rollout_pages`) of `groups_P`, tagged by their builders."""
    write_rollout_report(
        ctx.log_dir,
        step=step,
        groups_P=groups_P,
        tags_P=[b.logging_tags() for b in builders_P],
        decode=ctx.decode,
        num_groups_to_log=ctx.config.num_groups_to_log,
        advantage_estimator=ctx.config.advantage_estimator,
        export_summaries=ctx.config.rollout_json_export,
    )


async def update_policy(ctx: RunContext, groups_P: Sequence[TrajectoryGroup]) -> PolicyUpdate:
    """`train_on_groups` on the step's groups, timed as the cookbook's
    `do_train_step_and_get_sampling_client`."""
    with span("do_train_step_and_get_sampling_client"):
        return await train_on_groups(
            groups_P,
            training_client=ctx.training_client,
            kl_reference_client=ctx.kl_reference_client,
            config=ctx.config,
            adam_params=ctx.adam_params,
        )


def update_metrics(
    ctx: RunContext,
    totals: TokenTotals,
    groups_P: Sequence[TrajectoryGroup],
    update: PolicyUpdate,
) -> tuple[dict[str, Any], TokenTotals]:
    """The update's metrics, then the step's token counts (`count_tokens` of the step's
    successful `groups_P` and those it trained on), and the totals after the step."""
    metrics: dict[str, Any] = dict(update.metrics)
    tokens, totals = count_tokens(
        ctx,
        totals,
        groups_P,
        update.trained_groups_P,
        num_datums=int(update.metrics["batch/num_datums"]),
    )
    metrics.update(tokens)
    return metrics, totals


async def save_checkpoint_due(
    ctx: RunContext, state: RunState, step: int, *, final: bool = False, periodic: bool = False
) -> CheckpointRecord | None:
    """The save due after `step` completed steps (`final`: the run's last, always saved;
    `periodic`: one whatever the cadence), as `Checkpointer.save` decides; None when none is
    due. A save is timed as the span `save_checkpoint_async` (the cookbook's name)."""
    if not (final or periodic) and ctx.checkpointer.due(step) is None:
        return None
    with span("save_checkpoint_async"):
        return await ctx.checkpointer.save(
            step,
            final=final,
            periodic=periodic,
            rng_key_data=prng_key_data(state.key),
            kl_reference_path=ctx.kl_reference_path,
            cumulative_tokens=state.totals.tokens,
            discarded_tokens=state.totals.discarded,
        )


def write_spans(logs: RunLogs, step: int, timer: StepTimer) -> None:
    """The step's `timing_spans.jsonl` row (none when it recorded no span)."""
    if timer.spans:
        logs.spans.write({"step": step, "spans": span_dicts(timer.spans)})


async def finish_step(
    ctx: RunContext,
    logs: RunLogs,
    state: RunState,
    step: int,
    metrics: dict[str, Any],
    groups: Sequence[TrajectoryGroup],
    *,
    timer: StepTimer | None = None,
) -> None:
    """What follows a step's work (see the module docstring, 4.).

    Args:
        ctx: the run's context.
        logs: the run's writers.
        state: the run's state after the step (what a checkpoint records).
        step: the step's index.
        metrics: the step's metrics (its `time/*` included).
        groups: the step's successful groups (their samples are logged).
        timer: the step's timer (the checkpoint's span joins it), or None.
    """
    config = ctx.config
    if groups and config.num_groups_to_log:
        logs.samples.write_many(
            decode_rollout_samples(
                groups, step=step, decode=ctx.decode, max_groups=config.num_groups_to_log
            )
        )
    row = {"step": step, **metrics}
    logs.metrics.write(row)
    logs.trackers.log_metrics(row, step=step)
    logs.progress.step_done(step, metrics)
    step_logger.info("%s", format_progress_line(step, metrics))
    timer = StepTimer() if timer is None else timer
    with recording(timer):
        await save_checkpoint_due(ctx, state, step + 1)
    write_spans(logs, step, timer)
    every = config.span_chart_every
    if every and step % every == 0 and timer.spans:
        chart = iteration_dir(ctx.log_dir, step) / GANTT_FILE
        # off the event loop: the async mode's rollouts go on while it draws
        await asyncio.to_thread(write_span_gantt_html, step, span_dicts(timer.spans), chart)
