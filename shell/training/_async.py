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
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import jax
import msgspec
import numpy as np
from returns.result import Success

from rlpure import metrics as metrics_lib
from rlpure.records import TrajectoryGroup
from shell.completion import TinkerTokenCompleter
from shell.config import TrainConfig
from shell.env import EnvGroupBuilder, RLDataset
from shell.errors import CheckpointError, ConfigError
from shell.rollouts import do_group_rollout_outcome
from shell.timing import StepTimer, span, step_timer
from shell.training._logs import read_jsonl, truncate_jsonl_by_step
from shell.training._policy_update import drops_constant_group, train_on_groups
from shell.training._reports import write_rollout_report
from shell.training._resume import prng_key_data
from shell.training._run import _count_tokens, _evaluates, _Run, _run_evaluators

__all__ = [
    "ASYNC_STATE_FILE",
    "AsyncState",
    "FinishStep",
    "check_async_dataset",
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


class FinishStep(Protocol):
    """What `train` does after a step's work (samples, metrics row, progress, checkpoint)."""

    def __call__(
        self,
        step: int,
        metrics: dict[str, Any],
        groups: Sequence[TrajectoryGroup],
        *,
        timer: StepTimer | None = None,
    ) -> Awaitable[None]: ...


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


def _state_at(log_dir: Path, step: int) -> AsyncState | None:
    """The `ASYNC_STATE_FILE` row of `step`, after dropping rows past it."""
    path = log_dir / ASYNC_STATE_FILE
    truncate_jsonl_by_step(path, keep_below=step + 1)
    found = None
    for n, row in enumerate(read_jsonl(path), start=1):
        try:
            state = msgspec.convert(row, AsyncState)
        except msgspec.ValidationError as err:
            raise CheckpointError(f"{path}:{n}: {err}") from None
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
    """The state the loops share (one event loop; mutable by design)."""

    run: _Run
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

    def state(self, step: int) -> AsyncState:
        return AsyncState(step=step, cursor=self.cursor, pending=tuple(sorted(self.outstanding)))


async def _dataloader(shared: _Async) -> None:
    run = shared.run
    for position in shared.redo:  # pending since the resume (`shared.outstanding` has them)
        builder = shared.dataset.get_batch(position[0])[position[1]]
        await shared.builders.put((position, builder))
    for position, builder in _positions(shared.dataset, shared.cursor, run.num_steps):
        await shared.builders.put((position, builder))
        # handed out only now: a kill while the put waited finds it at the cursor
        shared.outstanding.add(position)
        shared.cursor = _next_position(shared.dataset, position)
    logger.info("[async dataloader] no more data; stopping the rollout workers")
    for _ in range(shared.num_workers):
        await shared.builders.put(_Shutdown())


async def _worker(shared: _Async) -> None:
    run, config = shared.run, shared.run.config
    while True:
        item = await shared.builders.get()
        if isinstance(item, _Shutdown):
            break
        position, builder = item
        await shared.slots.acquire()
        # read the sampler and its step together, after taking a slot (no await between)
        sampler, sampler_step = run.sampling_client, shared.sampler_step
        policy = TinkerTokenCompleter(
            sampler,
            max_tokens=config.max_tokens,
            temperature=config.temperature,
            seed=group_seed(config.seed, position),
        )
        start = time.perf_counter()
        with span("trajectory_group_worker"):
            outcome = await do_group_rollout_outcome(
                builder, policy, strategy=run.strategy, termination=run.termination
            )
        if run.error_counter is not None:
            run.error_counter.ingest(outcome)
        group = outcome.unwrap() if isinstance(outcome, Success) else None
        if group is not None and drops_constant_group(config, group):
            _count_tokens(run, [group], [])  # dropped sampling counts in the running totals
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
    wanted = shared.run.config.async_config.groups_per_batch  # type: ignore[union-attr]
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
    run, config = shared.run, shared.run.config
    run.key, _ = jax.random.split(run.key)  # one split per step, as the sync loop
    metrics: dict[str, Any] = {
        "training_client/step": step,
        "optim/lr": config.learning_rate,
        "progress/done_frac": (step + 1) / run.num_steps,
    }
    if _evaluates(run) and step % config.eval_every == 0:
        metrics.update(await _run_evaluators(run, step))
    metrics.update(
        metrics_lib.sampling_client_metrics(
            [c.sampler_step for c in batch], [c.seconds for c in batch]
        )
    )
    groups = [c.group for c in batch]
    write_rollout_report(
        run.log_dir,
        step=step,
        groups_P=groups,
        tags_P=[c.builder.logging_tags() for c in batch],
        decode=run.decode,
        num_groups_to_log=config.num_groups_to_log,
        advantage_estimator=config.advantage_estimator,
    )
    metrics.update(
        metrics_lib.trajectory_metrics(groups, [c.builder.logging_tags() for c in batch])
    )
    metrics["batch/num_groups"] = len(groups)
    with span("do_train_step_and_get_sampling_client"):
        update = await train_on_groups(
            groups,
            training_client=run.training_client,
            kl_reference_client=run.kl_reference_client,
            config=config,
            adam_params=run.adam_params,
        )
    staleness = [step - c.sampler_step for c in batch]
    metrics["async/staleness_max"] = max(staleness)
    metrics["async/staleness_min"] = min(staleness)
    metrics["async/staleness_mean"] = sum(staleness) / len(staleness)
    metrics.update(update.metrics)
    metrics.update(
        _count_tokens(
            run,
            groups,
            update.trained_groups_P,
            num_datums=int(update.metrics["batch/num_datums"]),
        )
    )
    # publish the new sampler, then free the trained groups' slots (no await in between), so
    # rollouts started on those slots sample from the new weights
    run.sampling_client = update.sampling_client
    shared.sampler_step = step + 1
    for completed in batch:
        shared.outstanding.discard(completed.position)
        shared.slots.release()
    if run.error_counter is not None:
        metrics.update(run.error_counter.get_metrics())
    return metrics


async def _training_loop(
    shared: _Async, finish_step: FinishStep, state_writer: Callable[[AsyncState], None]
) -> int:
    """Trains until the last step or the end of the data; returns the steps completed."""
    run = shared.run
    waiting: list[_Completed] = []
    step = shared.start
    while step < run.num_steps:
        with step_timer() as timer:
            batch = await _collect(shared, waiting)
            if batch is None:
                break
            metrics = await _train_step(shared, step, batch)
        metrics.update(timer.metrics())
        state_writer(shared.state(step + 1))  # before the step's checkpoint (finish_step)
        await finish_step(step, metrics, [c.group for c in batch], timer=timer)
        step += 1
    if step < run.num_steps:
        groups_per_batch = run.config.async_config.groups_per_batch  # type: ignore[union-attr]
        logger.warning(
            "Async training ran out of data after %d of %d steps. Each step trains %d groups "
            "that survive filtering and rollout errors, so steps run out before dataset "
            "batches do when groups are filtered or fail, or when dataset batches hold fewer "
            "groups than that. To train more steps, raise max_steps (and num_epochs, if it "
            "caps the run).",
            step - shared.start,
            run.num_steps - shared.start,
            groups_per_batch,
        )
    return step


async def run_async(
    run: _Run, *, start: int, dataset: RLDataset, finish_step: FinishStep
) -> list[int]:
    """Runs the async mode from step `start` to `run.num_steps` (see the module docstring).

    Args:
        run: the loop's state (`run.sampling_client` is the sampler of the weights at `start`).
        start: the first step (> 0 when resumed).
        dataset: the epoch-cycled dataset (batch `b` is `dataset.get_batch(b)`, `b <
            run.num_steps`).
        finish_step: `train`'s per-step bookkeeping, awaited after each step with its metrics,
            trained groups and timer (it writes the step's checkpoint when due).

    Returns:
        The skipped steps (always empty: an async step always trains).

    Raises:
        Exception: the first error of any loop (a group error the strategy does not skip, a
            training call's), after every loop was cancelled and awaited.
        CheckpointError: a damaged `async_state.jsonl`.
    """
    config = run.config
    assert config.async_config is not None
    log_dir = Path(run.log_dir)
    cursor: Position = (start, 0)
    redo: tuple[Position, ...] = ()
    if start > 0:
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
        else:
            cursor, redo = found.cursor, found.pending
            logger.info(
                "%s: resuming async data at batch %d group %d with %d groups to redo",
                log_dir,
                cursor[0],
                cursor[1],
                len(redo),
            )
    else:
        (log_dir / ASYNC_STATE_FILE).unlink(missing_ok=True)
    slots = config.async_config.groups_per_batch * (config.async_config.max_steps_off_policy + 1)
    shared = _Async(
        run=run,
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

    def write_state(state: AsyncState) -> None:
        with state_path.open("ab") as out:
            out.write(encoder.encode(state) + b"\n")

    # as the cookbook: a full checkpoint where the async run starts, before any sampling
    write_state(shared.state(start))
    await run.checkpointer.save(
        start,
        periodic=True,
        rng_key_data=prng_key_data(run.key),
        kl_reference_path=run.kl_reference_path,
        cumulative_tokens=run.tokens,
        discarded_tokens=run.discarded_tokens,
    )
    producers = [
        asyncio.create_task(_dataloader(shared), name="async_dataloader"),
        *(
            asyncio.create_task(_worker(shared), name=f"async_rollout_worker_{i}")
            for i in range(slots)
        ),
    ]
    trainer = asyncio.create_task(
        _training_loop(shared, finish_step, write_state), name="async_training_loop"
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
    write_state(shared.state(run.num_steps))  # the row of train's final checkpoint
    return []
