"""One group: strategy, grading under a termination policy, shielded cleanup (`shell.rollouts`).

The cookbook's `do_group_rollout` and `do_group_rollout_and_filter_constant_reward`, and the
rollout executor (`set_rollout_executor`) that the latter dispatches groups to.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

from rlpure.records import Metrics, TrajectoryGroup
from shell.clients import SamplingClient
from shell.completion import TinkerTokenCompleter, TokenCompleter
from shell.env import EnvGroupBuilder
from shell.errors import AllTrajectoriesFailedError
from shell.rollouts._policies import (
    TerminationRewardPolicy,
    apply_zero_reward_on_limit,
    should_skip_group_grading,
)
from shell.rollouts._strategies import (
    FailFast,
    RolloutResult,
    RolloutStrategy,
)
from shell.timing import span

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_R = TypeVar("_R")


# --- group rollout -----------------------------------------------------------------------------


async def _score_group(
    builder: EnvGroupBuilder, result: RolloutResult, termination: TerminationRewardPolicy | None
) -> TrajectoryGroup:
    trajectories = list(result.trajectories)
    if not trajectories:
        raise ValueError(
            f"do_group_rollout: the strategy returned no trajectories for {type(builder).__name__}"
        )
    if should_skip_group_grading(termination, trajectories):
        rewards_and_metrics: list[tuple[float, Metrics]] = [(0.0, {}) for _ in trajectories]
    else:
        grader_timeout = None if termination is None else termination.grader_timeout_seconds
        deadline = asyncio.timeout(grader_timeout)
        try:
            async with deadline:
                with span("compute_group_rewards"):
                    rewards_and_metrics = list(
                        await builder.compute_group_rewards(trajectories, list(result.envs))
                    )
        except TimeoutError:
            if deadline.expired():
                raise TimeoutError(
                    f"{type(builder).__name__}.compute_group_rewards exceeded "
                    f"grader_timeout_seconds={grader_timeout:g}"
                ) from None
            raise
    if len(rewards_and_metrics) != len(trajectories):
        raise ValueError(
            f"{type(builder).__name__}.compute_group_rewards: returned "
            f"{len(rewards_and_metrics)} (reward, metrics) pairs for "
            f"{len(trajectories)} trajectories"
        )
    rewards_G = [r for r, _ in rewards_and_metrics]
    metrics_G = [m for _, m in rewards_and_metrics]
    if termination is not None:
        rewards_G, metrics_G = apply_zero_reward_on_limit(
            termination, trajectories, rewards_G, metrics_G
        )
    return TrajectoryGroup(
        trajectories_G=tuple(trajectories),
        final_rewards_G=tuple(rewards_G),
        metrics_G=tuple(metrics_G),
        rollout_errors=tuple(result.errors),
    )


async def _shielded_cleanup(builder: EnvGroupBuilder, propagating: BaseException | None) -> None:
    """Runs `builder.cleanup()` to the end even if this task is cancelled, any number of times.

    A cancellation that arrived meanwhile is re-raised once cleanup is done. A cleanup error
    raises when nothing else propagates; otherwise it is logged and noted on `propagating`.
    """
    cleanup = asyncio.ensure_future(builder.cleanup())
    cancelled = False
    while not cleanup.done():
        try:
            await asyncio.shield(cleanup)
        except asyncio.CancelledError:
            cancelled = True
        except Exception:  # cleanup's own error: read from the task below
            pass
    error = None if cleanup.cancelled() else cleanup.exception()
    if error is not None and (propagating is not None or cancelled):
        logger.error(
            "%s.cleanup failed while %s propagated: %s: %s",
            type(builder).__name__,
            "a cancellation" if propagating is None else type(propagating).__name__,
            type(error).__name__,
            error,
        )
        if propagating is not None:
            propagating.add_note(
                f"{type(builder).__name__}.cleanup also failed: {type(error).__name__}: {error}"
            )
    if cancelled:
        raise asyncio.CancelledError
    if error is not None and propagating is None:
        raise error


async def do_group_rollout(
    env_group_builder: EnvGroupBuilder,
    policy: TokenCompleter,
    strategy: RolloutStrategy | None = None,
    termination: TerminationRewardPolicy | None = None,
) -> TrajectoryGroup:
    """Runs one group: the strategy's rollouts, group rewards, then `cleanup()` (always, once).

    Args:
        env_group_builder: makes the group's envs and scores the group.
        policy: samples actions.
        strategy: failure handling; `FailFast()` by default.
        termination: a `TerminationRewardPolicy` (stop-reason-keyed rewards: grader timeout,
            skip grading when every trajectory timed out, clamp limit-stopped trajectories to
            `min(total, 0)`); None leaves rewards untouched.

    Returns:
        The group: `final_rewards_G` from `compute_group_rewards` (after the clamp), failures
        of retried or accepted rollouts in `rollout_errors`.

    Raises:
        AllTrajectoriesFailedError: `MinViableGroup` fell below its floor.
        TimeoutError: `compute_group_rewards` exceeded `termination.grader_timeout_seconds`.
        Exception: a rollout's exception (under `FailFast`, or `RetryOnFailure` with its budget
            spent), or one from `make_envs` or `compute_group_rewards`, unchanged.
    """
    strategy = FailFast() if strategy is None else strategy
    try:
        result = await strategy.execute(env_group_builder, policy)
        group = await _score_group(env_group_builder, result, termination)
    except BaseException as exc:
        await _shielded_cleanup(env_group_builder, exc)
        raise
    await _shielded_cleanup(env_group_builder, None)
    return group


def skips_group(strategy: RolloutStrategy, exc: Exception) -> bool:
    """Whether a group that raised `exc` is skipped rather than failing the run."""
    if strategy.is_fatal(exc):
        return False
    return isinstance(exc, AllTrajectoriesFailedError) or strategy.catches_group_errors


def _all_same(values: Sequence[float]) -> bool:
    return all(v == values[0] for v in values)


# --- the rollout executor ----------------------------------------------------------------------

_rollout_executor: ContextVar[Executor | None] = ContextVar("rollout_executor", default=None)


def set_rollout_executor(executor: Executor | None) -> None:
    """Sends every later group rollout to `executor` (None: back to in-process coroutines).

    The cookbook's `set_rollout_executor`: `do_group_rollout_and_filter_constant_reward` and
    `do_batch_rollouts` then run each group as `asyncio.run(...)` in a worker via
    `loop.run_in_executor`; the streaming and async loops send each group the same way
    (`do_group_rollout_outcome`). Any `concurrent.futures.Executor` works: a thread pool, a
    spawn-started `ProcessPoolExecutor`, Dask `distributed` (`Client.get_executor()`), Ray's.

    The pickling contract (for process pools and remote workers): each group travels as one
    pickled task — its `EnvGroupBuilder`, the policy (a `TinkerTokenCompleter` holding the
    sampling client; Tinker's and the fake SDK's pickle, the local backend's does not), the
    strategy and the termination policy — and runs as `asyncio.run(...)` on a fresh event loop
    in the worker; the `TrajectoryGroup` (or the skipped group's `GroupFailure`) comes back
    pickled. So builders must be importable module-level classes whose state pickles (no
    lambdas or closures, open files, locks, or objects bound to the parent's event loop); envs
    are made in the worker by `make_envs`, and `cleanup()` runs there, once per group, while
    the parent's copy of the builder never sees the worker's changes. A seeded policy is
    copied per group, so in a process pool groups dispatched together reuse its seed sequence.
    A rollout the loop cancels (an error elsewhere, the end of an async run) keeps running in
    the executor until it finishes; its result is dropped. The setting is a `ContextVar`: it
    holds for tasks started after the call in the same context.

    Raises:
        ValueError: a `ProcessPoolExecutor` whose workers start by `fork` (the SDK's background
            thread and JAX do not survive it; use `mp_context=multiprocessing.get_context(
            "spawn")`).
    """
    context = getattr(executor, "_mp_context", None)
    start_method = getattr(context, "get_start_method", None)
    if start_method is not None and start_method() == "fork":
        raise ValueError(
            "set_rollout_executor: this ProcessPoolExecutor starts its workers by 'fork', "
            "which hangs the Tinker client and JAX in the workers; create it with "
            "ProcessPoolExecutor(..., mp_context=multiprocessing.get_context('spawn'))"
        )
    _rollout_executor.set(executor)


def get_rollout_executor() -> Executor | None:
    """The executor group rollouts are sent to, or None when they run in-process."""
    return _rollout_executor.get()


async def run_in_rollout_executor(executor: Executor, fn: Callable[[_T], _R], task: _T) -> _R:
    """`fn(task)` in `executor`, awaited from the event loop."""
    return await asyncio.get_running_loop().run_in_executor(executor, fn, task)


@dataclass(frozen=True)
class _FilterTask:
    """The pickleable inputs of one `do_group_rollout_and_filter_constant_reward` call."""

    sampling_client: SamplingClient
    env_group_builder: EnvGroupBuilder
    max_tokens: int
    temperature: float
    remove_constant_reward_groups: bool
    strategy: RolloutStrategy
    termination: TerminationRewardPolicy | None


def _run_filter_task(task: _FilterTask) -> TrajectoryGroup | None:
    """Executor entry point: the group rollout in a fresh event loop of the worker."""
    return asyncio.run(
        _filter_in_process(
            task.sampling_client,
            task.env_group_builder,
            task.max_tokens,
            task.temperature,
            task.remove_constant_reward_groups,
            task.strategy,
            task.termination,
        )
    )


async def do_group_rollout_and_filter_constant_reward(
    sampling_client: SamplingClient,
    env_group_builder: EnvGroupBuilder,
    max_tokens: int,
    temperature: float,
    do_remove_constant_reward_groups: bool,
    enable_logging: bool = True,
    strategy: RolloutStrategy | None = None,
    termination: TerminationRewardPolicy | None = None,
) -> TrajectoryGroup | None:
    """One group sampled from `sampling_client`, or None when it is skipped (the cookbook's).

    Args:
        sampling_client: a `tinker.SamplingClient` or any `shell.clients.SamplingClient`.
        env_group_builder: the group.
        max_tokens: cap on sampled tokens per action.
        temperature: sampling temperature.
        do_remove_constant_reward_groups: return None when every trajectory of the group has
            the same total reward (no signal under group-centred advantages).
        enable_logging: accepted for the cookbook's signature; this shell writes no logtree
            report of the rollout.
        strategy: failure handling; `FailFast()` by default.
        termination: see `do_group_rollout`.

    Returns:
        The group, or None if it was skipped: `AllTrajectoriesFailedError` (any strategy), any
        other non-fatal `Exception` under a strategy with `catches_group_errors`, or constant
        rewards when filtering. With a rollout executor set (`set_rollout_executor`), the
        group runs there (the cookbook's dispatch).
    """
    del enable_logging
    strategy = FailFast() if strategy is None else strategy
    executor = get_rollout_executor()
    if executor is not None:
        task = _FilterTask(
            sampling_client=sampling_client,
            env_group_builder=env_group_builder,
            max_tokens=max_tokens,
            temperature=temperature,
            remove_constant_reward_groups=do_remove_constant_reward_groups,
            strategy=strategy,
            termination=termination,
        )
        return await run_in_rollout_executor(executor, _run_filter_task, task)
    return await _filter_in_process(
        sampling_client,
        env_group_builder,
        max_tokens,
        temperature,
        do_remove_constant_reward_groups,
        strategy,
        termination,
    )


async def _filter_in_process(
    sampling_client: SamplingClient,
    env_group_builder: EnvGroupBuilder,
    max_tokens: int,
    temperature: float,
    do_remove_constant_reward_groups: bool,
    strategy: RolloutStrategy,
    termination: TerminationRewardPolicy | None,
) -> TrajectoryGroup | None:
    policy = TinkerTokenCompleter(sampling_client, max_tokens=max_tokens, temperature=temperature)
    try:
        with span("do_group_rollout_and_filter_constant_reward"):
            group = await do_group_rollout(env_group_builder, policy, strategy, termination)
    except Exception as exc:
        if not skips_group(strategy, exc):
            raise
        logger.warning("Rollout error (%s), skipping group: %s", type(exc).__name__, exc)
        return None
    if do_remove_constant_reward_groups and _all_same(group.get_total_rewards()):
        return None
    return group
