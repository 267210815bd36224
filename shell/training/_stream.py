"""Sync training with streaming minibatches (`TrainConfig.stream_minibatch_config`).

The cookbook 0.6.1's `do_sync_training_with_stream_minibatch` (with its
`do_train_step_streaming_and_get_sampling_client`) as one step function of
`shell.training._loop.train` (`run_stream_step`, same shape as the sync `run_sync_step`):

1. evaluation when due, as the sync step (on the sampler of the previous step);
2. every group of `dataset.get_batch(step)` starts rolling out at once (one task per group,
   `shell.rollouts.do_group_rollout_outcome`, in the rollout executor when one is set) on the
   step's sampler, with the sync step's seeds (one `TinkerTokenCompleter` seeded from the
   loop's key; sampler call `n` of the step uses `seed + n`);
3. groups are consumed **in the order they finish**: the step's `groups_per_batch` groups make
   `num_substeps` substeps of `num_minibatches` minibatches of
   `g = groups_per_batch / num_substeps / num_minibatches` groups; as soon as `g` groups have
   arrived, their datums (`prepare_datums`: advantages, batch, aggregation, KL shaping, per
   minibatch as the cookbook's `prepare_minibatch`) go to `forward_backward` at once; after a
   substep's last minibatch one `optim_step` is enqueued, then the substep's results are
   awaited (fwd_bwd results, then the optim step);
4. a group that failed (skipped by the strategy) or, with `remove_constant_reward_groups`, has
   constant reward fills its place in its minibatch but is not trained: the minibatch trains
   on the others (a minibatch with none is skipped, a substep with none sends no
   `optim_step`), as the cookbook. Unlike the sync step there is no "keep the first constant
   group" rule; a step where nothing trained is a skipped step (`progress/skipped`);
5. then one sampler of the new weights (`save_weights_and_get_sampling_client`), the
   post-update KL when configured, and the metrics of the whole batch.

Metrics: the sync step's keys (`progress/*`, `optim/lr`, `env/*` over every trained group,
`batch/*`, `tokens/*`, the optimizer's and `train/*` loss metrics from
`_policy_update._train_output_metrics`, `optim/kl_sample_train_*` over all datums, KL-penalty
metrics of the last minibatch, `kl_pre_post_*`), plus the cookbook's
`sampling_client/step_{max,min,mean}` and `time/sampling_time_{max,min,mean}` (each group's
rollout wall time), and the cookbook's spans (`shell.timing`):
`train/fwd_bwd_substep_{i}_mb_{j}_enqueue`, `train/optim_substep_{i}_enqueue`,
`train/fwd_bwd_substep_{i}_mb_{j}_consume`, `train/optim_substep_{i}_consume`, and
`trajectory_group_worker` per group.

The batch must hold exactly `groups_per_batch` groups (`check_stream_dataset`, a
`ConfigError` before anything runs): with more, the cookbook trains the first ones to finish
and leaves the others rolling out unused; with fewer, it waits forever. A step whose batch is
still short (a dataset whose batches vary) trains what it has: the last minibatch is partial;
a later batch with more groups stops the run at its step, with a `ConfigError`, before any of
them rolls out.

Cancellation: a step that raises (a group error the strategy does not skip, a training call
failing) cancels its other rollouts and waits for them (each group's `cleanup()` still runs
once) before the error propagates; no task outlives the step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import tinker
from returns.result import Success

from rlpure import metrics as metrics_lib
from rlpure.packing import DatumBatch
from shell.clients import APIFuture
from shell.completion import TinkerTokenCompleter
from shell.config import TrainConfig
from shell.env import EnvGroupBuilder, RLDataset
from shell.errors import ConfigError
from shell.rollouts import GroupOutcome, do_group_rollout_outcome
from shell.timing import span
from shell.training._policy_update import (
    TrainStepOutput,
    _train_output_metrics,
    check_provenance,
    drops_constant_group,
    post_update_kl_metrics,
    prepare_datums,
    records_stability_info,
)
from shell.training._run import RunContext, RunState, count_tokens
from shell.training._steps import StepResult, begin_step, record_rollouts, sampling_policy

__all__ = ["check_stream_dataset", "minibatch_sizes", "run_stream_step"]

logger = logging.getLogger(__name__)


def check_stream_dataset(config: TrainConfig, dataset: RLDataset) -> None:
    """Refuses a streaming run whose batches do not hold `groups_per_batch` groups.

    Reads `dataset.get_batch(0)` (the batches' size; builders are cheap records).

    Raises:
        ConfigError: `stream_minibatch_config.groups_per_batch` differs from the size of the
            dataset's first batch (or the dataset is empty).
    """
    stream = config.stream_minibatch_config
    if stream is None:
        return
    if len(dataset) == 0:
        raise ConfigError("TrainConfig.stream_minibatch_config: the dataset has no batches")
    size = len(dataset.get_batch(0))
    if stream.groups_per_batch != size:
        more = "larger" if stream.groups_per_batch > size else "smaller"
        raise ConfigError(
            f"TrainConfig.stream_minibatch_config.groups_per_batch: {stream.groups_per_batch} "
            f"is {more} than the dataset's batches ({size} groups); streaming trains each "
            "step on one whole batch, so set groups_per_batch to the batch size"
        )


def minibatch_sizes(config: TrainConfig) -> tuple[int, int, int]:
    """`(num_substeps, num_minibatches, groups per minibatch)` of a streaming run.

    Examples:
        >>> from shell.config import StreamMinibatchConfig
        >>> stream = StreamMinibatchConfig(groups_per_batch=8, num_minibatches=2)
        >>> minibatch_sizes(TrainConfig(backend="fake", num_substeps=2,
        ...                             stream_minibatch_config=stream))
        (2, 2, 2)
    """
    stream = config.stream_minibatch_config
    if stream is None:
        raise ValueError("minibatch_sizes: config.stream_minibatch_config is None")
    per_minibatch = stream.groups_per_batch // config.num_substeps // stream.num_minibatches
    return config.num_substeps, stream.num_minibatches, per_minibatch


@dataclass(frozen=True)
class _Arrival:
    """One finished group of the step: its builder, outcome and rollout wall time."""

    builder: EnvGroupBuilder
    outcome: GroupOutcome
    seconds: float


async def _roll_out(
    builder: EnvGroupBuilder,
    policy: TinkerTokenCompleter,
    ctx: RunContext,
    limit: asyncio.Semaphore,
    arrivals: asyncio.Queue[_Arrival | Exception],
) -> None:
    """One group into `arrivals`; an error the strategy does not skip goes there too, so the
    consumer raises it as soon as it is next waiting (cancellation propagates)."""
    try:
        async with limit:
            start = time.perf_counter()
            with span("trajectory_group_worker"):
                outcome = await do_group_rollout_outcome(
                    builder, policy, strategy=ctx.strategy, termination=ctx.termination
                )
    except Exception as exc:
        arrivals.put_nowait(exc)
        return
    arrivals.put_nowait(_Arrival(builder, outcome, time.perf_counter() - start))


async def _next_arrival(arrivals: asyncio.Queue[_Arrival | Exception]) -> _Arrival:
    found = await arrivals.get()
    if isinstance(found, Exception):
        raise found
    return found


def _padded_concat(arrays_D_T: Sequence[np.ndarray]) -> np.ndarray:
    """`[D_k, T_k]` arrays stacked along D, zero-padded to the widest T."""
    width = max(a.shape[1] for a in arrays_D_T)
    return np.concatenate([np.pad(a, ((0, 0), (0, width - a.shape[1]))) for a in arrays_D_T])


def _kl_sample_train(
    batches: Sequence[DatumBatch], outputs: Sequence[tinker.ForwardBackwardOutput]
) -> dict[str, float]:
    """`optim/kl_sample_train_*` over every datum of the step (sampling vs training logprobs)."""
    train_rows = [o["logprobs"].to_numpy() for fb in outputs for o in fb.loss_fn_outputs]
    sample, mask, train = [], [], []
    row = 0
    for batch in batches:
        sample.append(np.asarray(batch.logprobs_D_T, np.float32))
        mask.append(np.asarray(batch.mask_D_T, np.float32))
        trained = np.zeros(batch.shape, np.float32)
        for d in range(batch.num_datums):
            values = np.asarray(train_rows[row], np.float32)
            trained[d, : values.shape[0]] = values
            row += 1
        train.append(trained)
    found = metrics_lib.kl_sample_train_metrics(
        _padded_concat(sample), _padded_concat(train), _padded_concat(mask)
    )
    return {k: float(v) for k, v in found.items()}


async def run_stream_step(
    ctx: RunContext, state: RunState, step: int, *, dataset: RLDataset
) -> StepResult:
    """One streaming step (see the module docstring): its metrics, the successful groups in
    the order they finished (empty when nothing trained: a skipped step) and the run's state
    after it.

    Raises:
        ConfigError: the batch holds more than `groups_per_batch` groups (nothing rolled out).
        ValueError: `stable_reinforce` and a minibatch datum without provenance (earlier
            minibatches may have been sent, as in the cookbook).
        Exception: a group error the strategy does not skip, or a training call's error,
            after the step's other rollouts were cancelled and awaited.
    """
    config = ctx.config
    start = await begin_step(ctx, state, step)
    state = state._replace(key=start.key)
    builders = list(dataset.get_batch(step))
    stream = config.stream_minibatch_config
    assert stream is not None  # a streaming run
    if len(builders) > stream.groups_per_batch:  # batch 0 was checked; later ones may differ
        raise ConfigError(
            f"TrainConfig.stream_minibatch_config.groups_per_batch: {stream.groups_per_batch} "
            f"is smaller than the dataset's batch {step} ({len(builders)} groups); streaming "
            "trains each step on one whole batch (the cookbook drops the extra groups)"
        )
    policy = sampling_policy(config, state.sampling_client, seed=start.seed)
    arrivals: asyncio.Queue[_Arrival | Exception] = asyncio.Queue()
    limit = asyncio.Semaphore(config.max_concurrent_groups or max(1, len(builders)))
    tasks = [
        asyncio.create_task(_roll_out(b, policy, ctx, limit, arrivals), name=f"stream_group_{i}")
        for i, b in enumerate(builders)
    ]
    try:
        trained = await _train_minibatches(ctx, start.metrics, arrivals, num_groups=len(builders))
        return await _finish_stream_step(
            ctx, state, step, start.metrics, trained, num_groups=len(builders)
        )
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _Trained(NamedTuple):
    """What a streaming step's minibatches consumed and trained."""

    arrived: list[_Arrival]  # every group, in the order it finished
    successful: list[_Arrival]
    trained: list[_Arrival]
    batches: list[DatumBatch]
    fb_outputs: list[tinker.ForwardBackwardOutput]
    optim_outputs: list[tinker.OptimStepResponse]


async def _train_minibatches(
    ctx: RunContext,
    metrics: dict[str, Any],
    arrivals: asyncio.Queue[_Arrival | Exception],
    *,
    num_groups: int,
) -> _Trained:
    """Consumes the step's groups as they finish into minibatches, each sent at once, one
    `optim_step` per substep (see the module docstring, 3.-4.); the minibatches' datum
    metrics go into `metrics`."""
    config = ctx.config
    num_substeps, num_minibatches, per_minibatch = minibatch_sizes(config)
    loss_fn = config.training_loss_fn()
    done = _Trained([], [], [], [], [], [])
    for substep in range(num_substeps):
        futures: list[APIFuture[tinker.ForwardBackwardOutput]] = []
        for minibatch in range(num_minibatches):
            members: list[_Arrival] = []
            while len(members) < per_minibatch and len(done.arrived) < num_groups:
                arrival = await _next_arrival(arrivals)
                done.arrived.append(arrival)
                members.append(arrival)
            kept = []
            for arrival in members:
                if isinstance(arrival.outcome, Success):
                    done.successful.append(arrival)
                    if not drops_constant_group(config, arrival.outcome.unwrap()):
                        kept.append(arrival)
            if not kept:
                continue
            prepared = await prepare_datums(
                [a.outcome.unwrap() for a in kept],
                config=config,
                kl_reference_client=ctx.kl_reference_client,
                training_client=ctx.training_client,
            )
            metrics.update(prepared.metrics)
            with span(f"train/fwd_bwd_substep_{substep}_mb_{minibatch}_enqueue"):
                check_provenance(prepared.datums, loss_fn)
                futures.append(
                    ctx.training_client.forward_backward(
                        prepared.datums, loss_fn, config.loss_fn_config
                    )
                )
            done.trained.extend(kept)
            done.batches.append(prepared.batch)
        if not futures:
            continue
        with span(f"train/optim_substep_{substep}_enqueue"):
            optim_future = ctx.training_client.optim_step(ctx.adam_params)
        for minibatch, future in enumerate(futures):
            with span(f"train/fwd_bwd_substep_{substep}_mb_{minibatch}_consume"):
                done.fb_outputs.append(await future)
        with span(f"train/optim_substep_{substep}_consume"):
            done.optim_outputs.append(await optim_future)
    return done


async def _finish_stream_step(
    ctx: RunContext,
    state: RunState,
    step: int,
    metrics: dict[str, Any],
    done: _Trained,
    *,
    num_groups: int,
) -> StepResult:
    """The step's rollout-error counts, rollout pages and metrics, and the sampler of the new
    weights (see the module docstring, 5.)."""
    config = ctx.config
    if ctx.error_counter is not None:
        for arrival in done.arrived:
            ctx.error_counter.ingest(arrival.outcome)
        metrics.update(ctx.error_counter.get_metrics())
    groups = [a.outcome.unwrap() for a in done.successful]
    if groups:  # iteration_NNNNNN/train.html, train_rollout_summaries.jsonl
        record_rollouts(ctx, step, groups, [a.builder for a in done.successful])
    trained = done.trained
    if not trained:
        logger.warning(
            "Step %d: no group to train on (%d failed or constant-reward groups); skipping "
            "the step",
            step,
            num_groups,
        )
        metrics["progress/skipped"] = 1
        tokens, totals = count_tokens(ctx, state.totals, groups, [])
        metrics.update(tokens)
        return StepResult(metrics=metrics, groups=[], state=state._replace(totals=totals))
    trained_groups = [a.outcome.unwrap() for a in trained]
    metrics.update(
        metrics_lib.sampling_client_metrics([step] * len(trained), [a.seconds for a in trained])
    )
    metrics.update(
        metrics_lib.trajectory_metrics(trained_groups, [a.builder.logging_tags() for a in trained])
    )
    metrics["batch/num_groups"] = len(groups)
    metrics["batch/degenerate_groups_frac"] = 1.0 - len(trained) / len(groups)
    num_datums = sum(int(batch.num_datums) for batch in done.batches)
    metrics["batch/num_datums"] = num_datums
    metrics["batch/num_trained_groups"] = len(trained)
    output = TrainStepOutput(
        forward_backward=tuple(done.fb_outputs), optim_step=tuple(done.optim_outputs)
    )
    metrics.update(_train_output_metrics(output))
    metrics.update(_kl_sample_train(done.batches, done.fb_outputs))
    sampler = await ctx.training_client.save_weights_and_get_sampling_client(
        record_stability_info=records_stability_info(config)
    )
    if config.compute_post_kl:
        post = [await post_update_kl_metrics(sampler, batch) for batch in done.batches]
        metrics.update(_weighted_post_kl(post, done.batches))
    tokens, totals = count_tokens(ctx, state.totals, groups, trained_groups, num_datums=num_datums)
    metrics.update(tokens)
    state = state._replace(sampling_client=sampler, totals=totals)
    return StepResult(metrics=metrics, groups=groups, state=state)


def _weighted_post_kl(
    found: Sequence[dict[str, float]], batches: Sequence[DatumBatch]
) -> dict[str, float]:
    """Per-minibatch `kl_pre_post_*` combined into the whole batch's mean over action tokens."""
    weights = [float(np.asarray(batch.mask_D_T).sum()) for batch in batches]
    total = sum(weights) or 1.0
    return {
        key: sum(w * f[key] for w, f in zip(weights, found, strict=True)) / total
        for key in ("kl_pre_post_v1", "kl_pre_post_v2")
    }
