"""Async, off-policy training (`TrainConfig.async_config`): rollouts run while the model trains.

The cookbook 0.6.1's `do_async_training` (`AsyncConfig`), our own implementation, run by
`shell.training._loop.train` in place of its step loop (`run_async`):

- **Loops.** A dataloader hands out the run's groups in dataset order (batch `b` of
  `dataset.get_batch(b)`, `b` from the resumed position to the run's last batch, group by
  group) into a queue of `groups_per_batch` builders; `S = groups_per_batch *
  (max_steps_off_policy + 1)` rollout workers each take a builder, then one of `S` **slots**,
  then read the current sampler and its step together and roll the group out
  (`shell.rollouts.do_group_rollout_outcome`, in the rollout executor when one is set); the
  training loop trains a step at a time and frees the trained groups' slots only once the new
  sampler is in place. So at most `S` groups are started and not yet trained, and a rollout
  started on a freed slot samples from the newest weights.
- **Batches.** A step waits for `groups_per_batch` completed groups, also takes every group
  already finished, sorts them by the step of the sampler that produced them (oldest first;
  ties in completion order) and trains the first `groups_per_batch` (`train_on_groups`);
  the rest wait for later steps. **No group is discarded for staleness**: a slow rollout is
  trained when it finishes, even more than `max_steps_off_policy` steps stale (the cookbook's
  rule). A failed group (skipped by the strategy) and, with `remove_constant_reward_groups`,
  a constant-reward group are dropped by their worker, which frees the slot at once; steps
  therefore do not map one-to-one onto dataset batches.
- **Metrics** (the cookbook's names): `training_client/step`, `optim/lr`,
  `progress/done_frac`, `sampling_client/step_{max,min,mean}`,
  `time/sampling_time_{max,min,mean}`, `async/staleness_{max,min,mean}` (`step - sampler step`
  of the trained groups), then the sync update's keys (`env/*`, `batch/*`, `tokens/*`,
  `optim/*`, ...) and `rollout_errors/*`; the update's spans (the rollout workers run outside
  any step's timer, so their `trajectory_group_worker` spans are not recorded, as in the
  cookbook, whose workers run outside its `trace_iteration` windows).
- **End.** When the data runs out, the dataloader sends one shutdown per worker; the last
  worker to stop tells the training loop, which trains what is left as a final, smaller step
  and stops, warning when fewer steps ran than planned (the cookbook's warning). When the
  training loop ends (last step, or an error anywhere), the dataloader and workers are
  cancelled and awaited: rollouts still in flight are cancelled (each group's `cleanup()`
  still finishes once); rollouts inside a rollout executor's workers run to completion there.
  The first exception of any loop propagates after that; no task outlives `run_async`.
- **Checkpoints.** As the cookbook, a full checkpoint (state and sampler weights) is saved
  where the run starts (`"000000"` for a fresh run), then as the sync loop after each step
  (`save_every`, rolling saves) and at the end.
- **Evaluation.** Deliberate difference: evaluators run in the training loop before step `i`
  when `eval_every` divides `i` (as the sync loop; rollouts keep going meanwhile) and once at
  the end (`train`), instead of the cookbook's separate evaluation loop and event rows.
- **Seeds.** Group `(b, j)` samples with seed `SeedSequence([seed, b, j])` (one
  `TinkerTokenCompleter` per group; call `n` uses `seed + n`), whatever the schedule, so a
  resumed run re-samples a lost group with the seed it had.
- **Resume** (`ASYNC_STATE_FILE`): after each step `s` the loop appends
  `{"step": s + 1, "cursor": [b, j], "pending": [[b, j], ...]}` to `async_state.jsonl` before
  its checkpoint may be written: `cursor` is the next group the dataloader has not handed out
  and `pending` the groups handed out but neither trained nor dropped yet (queued, rolling
  out, or finished and waiting for a step). A run resumed from the checkpoint at step `s`
  reads that row and hands out `pending` first, then continues from `cursor`, so **no group is
  trained twice and none is skipped**. What is lost (as in the cookbook): the sampling of the
  pending groups, which roll out again from the resumed weights (so their staleness restarts
  at 0), the staleness they had, and the rollout-error counts. The cookbook restarts its
  dataloader at dataset batch `s` instead (its `TODO`): it may train groups twice or never,
  since steps are not batches; a log dir without the row (e.g. one the cookbook wrote) resumes
  that way, with a warning.

Bad input (`check_async_dataset`, before anything runs): `groups_per_batch` larger than the
dataset's batches is a `ConfigError`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from returns.result import Success

from rlpure import metrics as metrics_lib
from rlpure.records import TrajectoryGroup
from shell.config import TrainConfig
from shell.env import EnvGroupBuilder, RLDataset
from shell.errors import CheckpointError, ConfigError
from shell.rollouts import do_group_rollout_outcome
from shell.timing import span, step_timer
from shell.training._logs import read_jsonl, truncate_jsonl_by_step
from shell.training._policy_update import drops_constant_group
from shell.training._run import RunContext, RunState, count_tokens
from shell.training._steps import (
    RunLogs,
    StepsDone,
    begin_step,
    finish_step,
    record_rollouts,
    sampling_policy,
    save_checkpoint_due,
    update_metrics,
    update_policy,
)

__all__ = [
    "ASYNC_STATE_FILE",
    "AsyncState",
    "check_async_dataset",
    "check_async_state",
    "group_seed",
    "run_async",
]

logger = logging.getLogger(__name__)

ASYNC_STATE_FILE = "async_state.jsonl"
"""One `AsyncState` row per trained step of an async run, in the log dir."""

Position = tuple[int, int]
"""A group of the run: `(batch, index in dataset.get_batch(batch))`."""


class AsyncState(msgspec.Struct, frozen=True, kw_only=True):
    """Where an async run's data stands after `step` steps (one `ASYNC_STATE_FILE` row).

    Attributes:
        step: completed training steps (the checkpoint's `step`).
        cursor: the next group the dataloader has not handed out.
        pending: groups handed out and neither trained nor dropped, in dataset order.
    """

    step: int
    cursor: tuple[int, int]
    pending: tuple[tuple[int, int], ...] = ()


def check_async_dataset(config: TrainConfig, dataset: RLDataset) -> None:
    """Refuses an async run whose `groups_per_batch` exceeds the dataset's batches.

    Raises:
        ConfigError: `async_config.groups_per_batch` larger than the first batch, or an empty
            dataset.
    """
    run_async = config.async_config
    if run_async is None:
        return
    if len(dataset) == 0:
        raise ConfigError("TrainConfig.async_config: the dataset has no batches")
    size = len(dataset.get_batch(0))
    if run_async.groups_per_batch > size:
        raise ConfigError(
            f"TrainConfig.async_config.groups_per_batch: {run_async.groups_per_batch} is larger "
            f"than the dataset's batches ({size} groups); set it to at most {size}"
        )


def group_seed(seed: int, position: Position) -> int:
    """The sampling seed of group `position` (see the module docstring), in `[0, 2**31)`.

    Examples:
        >>> group_seed(0, (1, 2)) == group_seed(0, (1, 2)) != group_seed(0, (2, 1))
        True
    """
    words = np.random.SeedSequence([seed, *position]).generate_state(1)
    return int(words[0]) & 0x7FFFFFFF


# --- resume state --------------------------------------------------------------------------------


def _states(path: Path) -> list[AsyncState]:
    """Every `ASYNC_STATE_FILE` row of `path` (none when it is missing).

    Raises:
        LogFileError: a line that is not JSON (`read_jsonl`).
        CheckpointError: a row that is not an `AsyncState`, naming its row number.
    """
    states = []
    for n, row in enumerate(read_jsonl(path), start=1):
        try:
            states.append(msgspec.convert(row, AsyncState))
        except msgspec.ValidationError as err:
            raise CheckpointError(f"{path}: row {n}: {err}") from None
    return states


def check_async_state(log_dir: Path) -> None:
    """Reads the log dir's `ASYNC_STATE_FILE` without changing it, so that a damaged one stops a
    resumed run before anything in the log dir is rewritten (`train`'s preflight).

    Raises:
        LogFileError | CheckpointError: as `_states`.
    """
    _states(log_dir / ASYNC_STATE_FILE)


def _state_at(log_dir: Path, step: int) -> AsyncState | None:
    """The `ASYNC_STATE_FILE` row of `step`, after dropping rows past it."""
    path = log_dir / ASYNC_STATE_FILE
    truncate_jsonl_by_step(path, keep_below=step + 1)
    found = None
    for state in _states(path):
        if state.step == step:
            found = state
    return found


def _positions(
    dataset: RLDataset, start: Position, end_batch: int
) -> Iterator[tuple[Position, EnvGroupBuilder]]:
    batch, index = start
    while batch < end_batch:
        builders = list(dataset.get_batch(batch))
        for j in range(index, len(builders)):
            yield (batch, j), builders[j]
        batch, index = batch + 1, 0


def _next_position(dataset: RLDataset, position: Position) -> Position:
    batch, index = position
    return (batch, index + 1) if index + 1 < len(dataset.get_batch(batch)) else (batch + 1, 0)


# --- the loops -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Completed:
    """A finished group waiting to be trained."""

    position: Position
    builder: EnvGroupBuilder
    group: TrajectoryGroup
    sampler_step: int
    seconds: float


class _Shutdown:
    """Sentinel: no more builders (to a worker) or no more groups (to the training loop)."""


@dataclass
class _Async:
    """What the dataloader, the rollout workers and the training loop share.

    Mutable by design, and only this module touches it: the loops run concurrently on one
    event loop, and a worker must read the current sampler and its step together the moment it
    takes a slot, while the training loop publishes each new sampler (`state`) and the step of
    its weights (`sampler_step`) before it frees the trained groups' slots. Between awaits each
    change is atomic; the run's state (`state`, also changed by workers counting dropped
    groups' tokens) is a `RunState` value replaced as a whole.
    """

    ctx: RunContext
    state: RunState
    dataset: RLDataset
    start: int
    sampler_step: int
    cursor: Position
    redo: tuple[Position, ...]
    num_workers: int
    builders: asyncio.Queue[tuple[Position, EnvGroupBuilder] | _Shutdown]
    results: asyncio.Queue[_Completed | _Shutdown | None]
    slots: asyncio.Semaphore
    outstanding: set[Position] = field(default_factory=set)
    workers_alive: int = 0

    def async_state(self, step: int) -> AsyncState:
        """The `ASYNC_STATE_FILE` row after `step` steps."""
        return AsyncState(step=step, cursor=self.cursor, pending=tuple(sorted(self.outstanding)))


async def _dataloader(shared: _Async) -> None:
    for position in shared.redo:  # pending since the resume (`shared.outstanding` has them)
        builder = shared.dataset.get_batch(position[0])[position[1]]
        await shared.builders.put((position, builder))
    for position, builder in _positions(shared.dataset, shared.cursor, shared.ctx.num_steps):
        await shared.builders.put((position, builder))
        # handed out only now: a kill while the put waited finds it at the cursor
        shared.outstanding.add(position)
        shared.cursor = _next_position(shared.dataset, position)
    logger.info("[async dataloader] no more data; stopping the rollout workers")
    for _ in range(shared.num_workers):
        await shared.builders.put(_Shutdown())


async def _worker(shared: _Async) -> None:
    ctx, config = shared.ctx, shared.ctx.config
    while True:
        item = await shared.builders.get()
        if isinstance(item, _Shutdown):
            break
        position, builder = item
        await shared.slots.acquire()
        # read the sampler and its step together, after taking a slot (no await between)
        sampler, sampler_step = shared.state.sampling_client, shared.sampler_step
        policy = sampling_policy(config, sampler, seed=group_seed(config.seed, position))
        start = time.perf_counter()
        with span("trajectory_group_worker"):
            outcome = await do_group_rollout_outcome(
                builder, policy, strategy=ctx.strategy, termination=ctx.termination
            )
        if ctx.error_counter is not None:
            ctx.error_counter.ingest(outcome)
        group = outcome.unwrap() if isinstance(outcome, Success) else None
        if group is not None and drops_constant_group(config, group):
            # dropped sampling counts in the running totals
            _, totals = count_tokens(ctx, shared.state.totals, [group], [])
            shared.state = shared.state._replace(totals=totals)
            group = None
        if group is None:  # failed or filtered: never trained, its slot is free at once
            shared.outstanding.discard(position)
            shared.slots.release()
            shared.results.put_nowait(None)
            continue
        shared.results.put_nowait(
            _Completed(position, builder, group, sampler_step, time.perf_counter() - start)
        )
    shared.workers_alive -= 1
    if shared.workers_alive == 0:
        logger.info("[async worker] last rollout worker stopped; the training loop drains")
        shared.results.put_nowait(_Shutdown())


async def _collect(shared: _Async, waiting: list[_Completed]) -> list[_Completed] | None:
    """The next step's groups: the `groups_per_batch` oldest-sampler completed groups (fewer
    once the workers stopped; None when nothing is left)."""
    wanted = shared.ctx.config.async_config.groups_per_batch  # type: ignore[union-attr]
    while len(waiting) < wanted or not shared.results.empty():
        item = await shared.results.get()
        if isinstance(item, _Shutdown):
            shared.results.put_nowait(item)  # for later calls
            break
        if item is not None:
            waiting.append(item)
    if not waiting:
        return None
    waiting.sort(key=lambda c: c.sampler_step)  # stable: ties keep completion order
    batch = waiting[:wanted]
    del waiting[:wanted]
    return batch


async def _train_step(shared: _Async, step: int, batch: list[_Completed]) -> dict[str, Any]:
    """One step on `batch` (see the module docstring, Metrics); publishes the new sampler,
    then frees the trained groups' slots."""
    ctx = shared.ctx
    start = await begin_step(ctx, shared.state, step, step_metric="training_client/step")
    shared.state = shared.state._replace(key=start.key)
    metrics = start.metrics
    metrics.update(
        metrics_lib.sampling_client_metrics(
            [c.sampler_step for c in batch], [c.seconds for c in batch]
        )
    )
    groups = [c.group for c in batch]
    record_rollouts(ctx, step, groups, [c.builder for c in batch])
    metrics.update(
        metrics_lib.trajectory_metrics(groups, [c.builder.logging_tags() for c in batch])
    )
    metrics["batch/num_groups"] = len(groups)
    staleness = [step - c.sampler_step for c in batch]
    metrics["async/staleness_max"] = max(staleness)
    metrics["async/staleness_min"] = min(staleness)
    metrics["async/staleness_mean"] = sum(staleness) / len(staleness)
    update = await update_policy(ctx, groups)
    found, totals = update_metrics(ctx, shared.state.totals, groups, update)
    metrics.update(found)
    # publish the new sampler, then free the trained groups' slots (no await in between), so
    # rollouts started on those slots sample from the new weights
    shared.state = shared.state._replace(sampling_client=update.sampling_client, totals=totals)
    shared.sampler_step = step + 1
    for completed in batch:
        shared.outstanding.discard(completed.position)
        shared.slots.release()
    if ctx.error_counter is not None:
        metrics.update(ctx.error_counter.get_metrics())
    return metrics


async def _training_loop(
    shared: _Async, logs: RunLogs, state_writer: Callable[[AsyncState], None]
) -> StepsDone:
    """Trains until the last step or the end of the data; each step then goes through
    `finish_step` (its samples, metrics row, progress, checkpoint when due, spans)."""
    ctx = shared.ctx
    waiting: list[_Completed] = []
    last_metrics: dict[str, Any] = {}
    step = shared.start
    while step < ctx.num_steps:
        with step_timer() as timer:
            batch = await _collect(shared, waiting)
            if batch is None:
                break
            metrics = await _train_step(shared, step, batch)
        metrics.update(timer.metrics())
        state_writer(shared.async_state(step + 1))  # before the step's checkpoint
        groups = [c.group for c in batch]
        await finish_step(ctx, logs, shared.state, step, metrics, groups, timer=timer)
        last_metrics = metrics
        step += 1
    if step < ctx.num_steps:
        groups_per_batch = ctx.config.async_config.groups_per_batch  # type: ignore[union-attr]
        logger.warning(
            "Async training ran out of data after %d of %d steps. Each step trains %d groups "
            "that survive filtering and rollout errors, so steps run out before dataset "
            "batches do when groups are filtered or fail, or when dataset batches hold fewer "
            "groups than that. To train more steps, raise max_steps (and num_epochs, if it "
            "caps the run).",
            step - shared.start,
            ctx.num_steps - shared.start,
            groups_per_batch,
        )
    return StepsDone(
        state=shared.state,
        last_metrics=last_metrics,
        skipped=(),
        ran_out_at=step if step < ctx.num_steps else None,
    )


def _resumed_data(log_dir: Path, start: int) -> tuple[Position, tuple[Position, ...]]:
    """The dataloader's cursor and the groups to redo when resuming at `start` (see the
    module docstring, Resume); a fresh run (`start == 0`) drops an earlier run's rows."""
    if start == 0:
        (log_dir / ASYNC_STATE_FILE).unlink(missing_ok=True)
        return (0, 0), ()
    found = _state_at(log_dir, start)
    if found is None:
        logger.warning(
            "%s: no %s row for step %d; resuming the data at batch %d as the cookbook does "
            "(groups may be trained twice or skipped)",
            log_dir,
            ASYNC_STATE_FILE,
            start,
            start,
        )
        return (start, 0), ()
    logger.info(
        "%s: resuming async data at batch %d group %d with %d groups to redo",
        log_dir,
        found.cursor[0],
        found.cursor[1],
        len(found.pending),
    )
    return found.cursor, found.pending


async def run_async(
    ctx: RunContext, logs: RunLogs, state: RunState, *, start: int, dataset: RLDataset
) -> StepsDone:
    """Runs the async mode from step `start` to `ctx.num_steps` (see the module docstring).

    Args:
        ctx: the run's context.
        logs: the run's writers (each step goes through `finish_step`).
        state: the run's state at `start` (its sampler holds the weights at `start`).
        start: the first step (> 0 when resumed).
        dataset: the epoch-cycled dataset (batch `b` is `dataset.get_batch(b)`, `b <
            ctx.num_steps`).

    Returns:
        The run's state after the last step and its last metrics (no step is skipped: an
        async step always trains).

    Raises:
        Exception: the first error of any loop (a group error the strategy does not skip, a
            training call's), after every loop was cancelled and awaited.
        CheckpointError: a damaged `async_state.jsonl`.
    """
    config = ctx.config
    assert config.async_config is not None
    log_dir = Path(ctx.log_dir)
    cursor, redo = _resumed_data(log_dir, start)
    slots = config.async_config.groups_per_batch * (config.async_config.max_steps_off_policy + 1)
    shared = _Async(
        ctx=ctx,
        state=state,
        dataset=dataset,
        start=start,
        sampler_step=start,
        cursor=cursor,
        redo=redo,
        num_workers=slots,  # one worker per slot: the slots, not the workers, bound the lag
        builders=asyncio.Queue(maxsize=config.async_config.groups_per_batch),
        results=asyncio.Queue(),
        slots=asyncio.Semaphore(slots),
        outstanding=set(redo),  # still owed: a second kill before they train keeps them
        workers_alive=slots,
    )
    encoder = msgspec.json.Encoder()
    state_path = log_dir / ASYNC_STATE_FILE

    def write_state(row: AsyncState) -> None:
        with state_path.open("ab") as out:
            out.write(encoder.encode(row) + b"\n")

    # as the cookbook: a full checkpoint where the async run starts, before any sampling
    write_state(shared.async_state(start))
    await save_checkpoint_due(ctx, state, start, periodic=True)
    done = await _run_loops(shared, logs, write_state, num_workers=slots)
    write_state(shared.async_state(ctx.num_steps))  # the row of train's final checkpoint
    # the totals as they stand now: workers may have counted dropped groups after the loops'
    # last step, and the final row and checkpoint carry every token counted (the old live totals)
    return done._replace(state=shared.state)


async def _run_loops(
    shared: _Async, logs: RunLogs, write_state: Callable[[AsyncState], None], *, num_workers: int
) -> StepsDone:
    """The dataloader, the rollout workers and the training loop, until the training loop
    ends; the first error of any propagates once every loop was cancelled and awaited."""
    producers = [
        asyncio.create_task(_dataloader(shared), name="async_dataloader"),
        *(
            asyncio.create_task(_worker(shared), name=f"async_rollout_worker_{i}")
            for i in range(num_workers)
        ),
    ]
    trainer = asyncio.create_task(
        _training_loop(shared, logs, write_state), name="async_training_loop"
    )
    pending: set[asyncio.Task[Any]] = {*producers, trainer}
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # the first error of any loop propagates
            if trainer in done:  # nothing the producers make can be trained any more
                for task in producers:
                    task.cancel()
                pending.difference_update(producers)
    finally:
        for task in (*producers, trainer):
            task.cancel()
        await asyncio.gather(*producers, trainer, return_exceptions=True)
    return trainer.result()
