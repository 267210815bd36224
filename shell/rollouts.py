"""Rollouts: one episode, one group under a failure strategy, and a batch of groups.

Conventions:
- `do_single_rollout` runs one env to `episode_done`: observation → sample with the stop
  condition → `step` → ...; every step becomes a `rlpure.records.Transition` (observation,
  sampled tokens/logprobs/stop reason, reward, metrics, logs).
- `do_group_rollout` makes the group's envs, runs them **concurrently** under a strategy, then
  calls `compute_group_rewards` (each group reward is added to that trajectory's step rewards
  through `TrajectoryGroup.final_rewards_G`), then `cleanup()` — exactly once, also when a
  rollout fails, the rewards call fails, or the task is cancelled. Trajectories stay in slot
  order (env `g` of `make_envs()` fills slot `g`; a retry refills the same slot).
- Strategies decide what a failed trajectory means:
  `FailFast` — the first exception fails the group, cancels its siblings and propagates as is;
  `RetryOnFailure` — a failure listed in `failures` (or a per-rollout timeout,
  `RolloutTimeoutError`) is retried in a
  fresh env while the group's `max_retries` budget lasts; once spent, the next failure cancels
  the rest and fails the whole group (all-or-nothing, no partial-group bias);
  `MinViableGroup` — like retry, but a partial group is accepted once `⌈0.75·G⌉` (or
  `min_successful`) trajectories succeed; below the floor the group fails.
- Failures are values at this edge: each attempt runs under `returns.future.future_safe` with a
  **narrow** exception tuple (`ROLLOUT_FAILURES` plus the strategy's extras), so a failed
  attempt becomes a `RolloutError` on the group, while `asyncio.CancelledError` and programming
  errors (`TypeError`, `AttributeError`, ...) always propagate. `do_batch_rollouts` returns one
  `returns.result.Result` per group: `Success(TrajectoryGroup)` or `Failure(GroupFailure)`;
  under `FailFast` nothing is caught and the first failure propagates.
- `batch_rollout_error_metrics` counts `rollout_errors/<ErrorType>`, `rollout_errors/total` and
  `rollout_errors/groups_skipped` for one batch (per step, not cumulative).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import msgspec
import tinker
from returns.future import future_safe
from returns.io import IOResult
from returns.result import Failure, Result, Success
from returns.unsafe import unsafe_perform_io

from rlpure import metrics as metrics_lib
from rlpure.records import RolloutError, Trajectory, TrajectoryGroup, Transition
from shell.completers import TokenCompleter
from shell.env import Env, EnvGroupBuilder
from shell.errors import (
    BelowMinViableGroupError,
    GroupRolloutError,
    RetryBudgetExhaustedError,
    RlpureError,
    RolloutTimeoutError,
)

__all__ = [
    "ROLLOUT_FAILURES",
    "FailFast",
    "GroupFailure",
    "GroupOutcome",
    "MinViableGroup",
    "RetryOnFailure",
    "RolloutStrategy",
    "batch_rollout_error_metrics",
    "do_batch_rollouts",
    "do_group_rollout",
    "do_single_rollout",
    "min_viable_floor",
]

logger = logging.getLogger(__name__)

ROLLOUT_FAILURES: tuple[type[Exception], ...] = (
    RlpureError,
    ConnectionError,
    TimeoutError,
    tinker.APIConnectionError,
    tinker.APITimeoutError,
    tinker.InternalServerError,
    tinker.RateLimitError,
)
"""Exception types a tolerant strategy treats as an outside failure of one rollout.

Only transient failures: `RlpureError` covers `shell.errors.EnvFailure` (what envs should
raise), `ConnectionError` and `TimeoutError` network trouble and deadlines, and the SDK's
transient errors that survived its own retries (connection, timeout, 5xx, rate limit).
Deterministic failures -- a 4xx from the service (`BadRequestError`, `AuthenticationError`), a
missing file, a `TypeError` in env code, a record rejecting a non-finite reward -- are bugs or
configuration errors: retrying them would only repeat them, so they propagate. Add env-specific
types through a strategy's `failures`.
"""

_STOP_METRIC_PREFIX = "stop/"

_V = TypeVar("_V")
_E = TypeVar("_E")


def _to_result(io_result: IOResult[_V, _E]) -> Result[_V, _E]:
    """Unwraps the `IO` marker of a finished effect (we are at the edge that performed it)."""
    # `unsafe_perform_io` is annotated for `IO` only; it unwraps `IOResult` the same way.
    return unsafe_perform_io(io_result)  # type: ignore[arg-type]


# --- strategies --------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class FailFast:
    """Any exception fails the group at once, cancels its sibling rollouts, and propagates."""

    @property
    def tolerant(self) -> bool:
        return False


@dataclass(frozen=True, kw_only=True)
class RetryOnFailure:
    """Retry failed or timed-out rollouts in fresh envs; all-or-nothing once the budget is spent.

    Attributes:
        max_retries: retry budget shared by the whole group (>= 0).
        per_rollout_timeout: seconds before one rollout is cancelled and counted as a failure
            (`RolloutTimeoutError`, a `TimeoutError`); None disables it.
        failures: extra exception types treated as outside failures (beyond `ROLLOUT_FAILURES`).
    """

    max_retries: int = 3
    per_rollout_timeout: float | None = None
    failures: tuple[type[Exception], ...] = ()

    def __post_init__(self) -> None:
        _check_budget("RetryOnFailure", self.max_retries, self.per_rollout_timeout)

    @property
    def tolerant(self) -> bool:
        return True


@dataclass(frozen=True, kw_only=True)
class MinViableGroup:
    """Accept a partial group once a floor of rollouts succeeded; retry only below the floor.

    Attributes:
        min_successful: the floor; None means `⌈0.75·G⌉` for a group of `G` envs.
        max_retries: retry budget shared by the group, spent only while the floor is unmet.
        per_rollout_timeout: seconds before one rollout counts as failed; None disables it.
        failures: extra exception types treated as outside failures.
    """

    min_successful: int | None = None
    max_retries: int = 3
    per_rollout_timeout: float | None = None
    failures: tuple[type[Exception], ...] = ()

    def __post_init__(self) -> None:
        _check_budget("MinViableGroup", self.max_retries, self.per_rollout_timeout)
        if self.min_successful is not None and self.min_successful < 1:
            raise ValueError(
                f"MinViableGroup.min_successful: expected >= 1 or None, got {self.min_successful}"
            )

    @property
    def tolerant(self) -> bool:
        return True


RolloutStrategy: TypeAlias = FailFast | RetryOnFailure | MinViableGroup
"""How a group's failed rollouts are handled (one of the three strategy records)."""


def _check_budget(name: str, max_retries: int, timeout: float | None) -> None:
    if max_retries < 0:
        raise ValueError(f"{name}.max_retries: expected >= 0, got {max_retries}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"{name}.per_rollout_timeout: expected > 0 or None, got {timeout}")


def min_viable_floor(group_size: int, *, min_successful: int | None = None) -> int:
    """The MinViableGroup floor: `min_successful`, or `⌈0.75·G⌉` (G=4 → 3, G=8 → 6).

    Examples:
        >>> [min_viable_floor(g) for g in (1, 2, 4, 8, 16)]
        [1, 2, 3, 6, 12]
    """
    if min_successful is not None:
        return min_successful
    return math.ceil(0.75 * group_size)


# --- single rollout ----------------------------------------------------------------------------


def _stop_reason_from_metrics(transition: Transition) -> str | None:
    for key, value in transition.metrics.items():
        if key.startswith(_STOP_METRIC_PREFIX) and value >= 1:
            return key[len(_STOP_METRIC_PREFIX) :]
    return None


async def do_single_rollout(policy: TokenCompleter, env: Env) -> Trajectory:
    """Runs one episode of `env` with `policy` and records it.

    Args:
        policy: samples an action for each observation.
        env: a fresh, single-use env.

    Returns:
        The trajectory: one `Transition` per step and the observation after the last step;
        `stop_reason` is mirrored from a one-hot `stop/<reason>` metric of the last step.
    """
    ob, stop = await env.initial_observation()
    transitions: list[Transition] = []
    while True:
        ac = await policy(ob, stop)
        step = await env.step(ac.tokens, extra={"stop_reason": ac.stop_reason})
        transitions.append(
            Transition(
                ob=ob,
                ac=ac,
                reward=step.reward,
                episode_done=step.episode_done,
                metrics=step.metrics,
                logs=step.logs,
            )
        )
        ob, stop = step.next_observation, step.next_stop_condition
        if step.episode_done:
            break
    return Trajectory(
        transitions=tuple(transitions),
        final_ob=ob,
        stop_reason=_stop_reason_from_metrics(transitions[-1]),
    )


async def _timed_rollout(policy: TokenCompleter, env: Env, timeout: float | None) -> Trajectory:
    if timeout is None:
        return await do_single_rollout(policy, env)
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            return await do_single_rollout(policy, env)
    except TimeoutError:
        if deadline.expired():  # ours, not a TimeoutError raised by the env or the sampler
            raise RolloutTimeoutError(f"rollout exceeded its {timeout:g} s deadline") from None
        raise


# --- group rollout -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Collected:
    trajectories: list[Trajectory]
    envs: list[Env]
    errors: tuple[RolloutError, ...]


def _rollout_error(exc: BaseException) -> RolloutError:
    return RolloutError(error_type=type(exc).__name__, error_message=str(exc))


async def _cancel_and_wait(tasks: set[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


async def _collect(
    builder: EnvGroupBuilder, policy: TokenCompleter, strategy: RolloutStrategy
) -> _Collected:
    """Runs the group's rollouts concurrently under `strategy` (see the module docstring)."""
    envs = list(await builder.make_envs())
    group_size = len(envs)
    if group_size == 0:
        raise ValueError(f"{type(builder).__name__}.make_envs: returned no envs")
    if isinstance(strategy, FailFast):
        failures: tuple[type[Exception], ...] = ()
        retries_left, timeout, floor = 0, None, None
    else:
        failures = (*ROLLOUT_FAILURES, *strategy.failures)
        retries_left, timeout = strategy.max_retries, strategy.per_rollout_timeout
        floor = (
            min_viable_floor(group_size, min_successful=strategy.min_successful)
            if isinstance(strategy, MinViableGroup)
            else None
        )
    attempt = future_safe(exceptions=failures)(_timed_rollout)

    slot_of: dict[asyncio.Task[Any], int] = {}
    env_of_slot: list[Env] = list(envs)
    trajectory_of_slot: dict[int, Trajectory] = {}
    errors: list[RolloutError] = []

    async def run_attempt(env: Env) -> IOResult[Trajectory, Exception]:
        # The FutureResult is made inside the task, so a task cancelled before it starts
        # leaves no un-awaited coroutine behind.
        return await attempt(policy, env, timeout)

    def launch(slot: int, env: Env) -> asyncio.Task[Any]:
        env_of_slot[slot] = env
        task = asyncio.create_task(run_attempt(env))
        slot_of[task] = slot
        return task

    pending: set[asyncio.Task[Any]] = {launch(slot, env) for slot, env in enumerate(envs)}
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=slot_of.__getitem__):
                # Exceptions outside `failures` (bugs, FailFast errors, a cancelled child)
                # re-raise here; the `finally` cancels the siblings.
                match _to_result(task.result()):
                    case Success(trajectory):
                        trajectory_of_slot[slot_of[task]] = trajectory
                    case Failure(exc):
                        errors.append(_rollout_error(exc))
                        logger.warning(
                            "Rollout failed (%s: %s); %d retries left",
                            type(exc).__name__,
                            exc,
                            retries_left,
                        )
                        below_floor = floor is None or len(trajectory_of_slot) < floor
                        if retries_left > 0 and below_floor:
                            retries_left -= 1
                            fresh = list(await builder.make_envs())
                            pending.add(launch(slot_of[task], fresh[0]))
                        elif floor is None:
                            raise RetryBudgetExhaustedError(
                                f"{type(builder).__name__}: a rollout failed with the retry "
                                f"budget spent ({len(errors)} failures, max_retries="
                                f"{getattr(strategy, 'max_retries', 0)}); dropping the group",
                                errors=tuple(errors),
                            ) from exc
    finally:
        await _cancel_and_wait(pending)
        # When an exception leaves the loop, tasks of the same `done` batch may hold failures
        # nobody read; read them so asyncio does not log "exception was never retrieved".
        for task in slot_of:
            if task.done() and not task.cancelled():
                task.exception()

    if floor is not None and len(trajectory_of_slot) < floor:
        raise BelowMinViableGroupError(
            f"{type(builder).__name__}: only {len(trajectory_of_slot)}/{group_size} rollouts "
            f"succeeded, below the minimum viable group size {floor}; dropping the group",
            errors=tuple(errors),
        )
    slots = sorted(trajectory_of_slot)
    return _Collected(
        trajectories=[trajectory_of_slot[s] for s in slots],
        envs=[env_of_slot[s] for s in slots],
        errors=tuple(errors),
    )


async def do_group_rollout(
    builder: EnvGroupBuilder,
    policy: TokenCompleter,
    *,
    strategy: RolloutStrategy | None = None,
) -> TrajectoryGroup:
    """Runs one group: envs concurrently, then group rewards, then `cleanup()` (always, once).

    Args:
        builder: makes the group's envs and scores the group.
        policy: samples actions.
        strategy: failure handling; `FailFast()` by default.

    Returns:
        The group, `final_rewards_G` from `compute_group_rewards`, failures of retried or
        dropped rollouts in `rollout_errors`.

    Raises:
        GroupRolloutError: a tolerant strategy gave up on the group (`.errors` lists why).
        Exception: under `FailFast`, the first rollout exception, unchanged.
    """
    strategy = FailFast() if strategy is None else strategy
    try:
        collected = await _collect(builder, policy, strategy)
        rewards_and_metrics = list(
            await builder.compute_group_rewards(collected.trajectories, collected.envs)
        )
        if len(rewards_and_metrics) != len(collected.trajectories):
            raise ValueError(
                f"{type(builder).__name__}.compute_group_rewards: returned "
                f"{len(rewards_and_metrics)} (reward, metrics) pairs for "
                f"{len(collected.trajectories)} trajectories"
            )
        group = TrajectoryGroup(
            trajectories_G=tuple(collected.trajectories),
            final_rewards_G=tuple(r for r, _ in rewards_and_metrics),
            metrics_G=tuple(m for _, m in rewards_and_metrics),
            rollout_errors=collected.errors,
        )
    except BaseException:
        # Clean up, but never let a cleanup failure replace the error that is propagating
        # (it could turn a programming error into a skippable outside failure).
        try:
            await builder.cleanup()
        except Exception:
            logger.exception(
                "%s.cleanup failed while handling another error", type(builder).__name__
            )
        raise
    await builder.cleanup()
    return group


# --- batches -----------------------------------------------------------------------------------


class GroupFailure(msgspec.Struct, frozen=True, kw_only=True):
    """A group that was dropped: why, and every rollout error captured on the way.

    Attributes:
        error_type: class name of the exception that failed the group.
        error_message: its message.
        errors: the trajectory failures captured before giving up (may be empty when the group
            failed outside a rollout, e.g. in `make_envs` or `compute_group_rewards`).
    """

    error_type: str
    error_message: str
    errors: tuple[RolloutError, ...] = ()


GroupOutcome: TypeAlias = Result[TrajectoryGroup, GroupFailure]


def _group_failure(exc: Exception) -> GroupFailure:
    errors = exc.errors if isinstance(exc, GroupRolloutError) else (_rollout_error(exc),)
    return GroupFailure(error_type=type(exc).__name__, error_message=str(exc), errors=errors)


async def do_batch_rollouts(
    builders_P: Sequence[EnvGroupBuilder],
    policy: TokenCompleter,
    *,
    strategy: RolloutStrategy | None = None,
    max_concurrent_groups: int | None = None,
) -> list[GroupOutcome]:
    """Runs all groups of a batch concurrently, at most `max_concurrent_groups` at a time.

    Args:
        builders_P: one builder per problem.
        policy: samples actions.
        strategy: failure handling; `FailFast()` by default.
        max_concurrent_groups: bound on groups in flight (None: unbounded).

    Returns:
        One outcome per builder, same order: `Success(TrajectoryGroup)` or, under a tolerant
        strategy, `Failure(GroupFailure)` for a group that was dropped (a failure listed in
        the strategy's exception tuple, in a rollout, `make_envs` or `compute_group_rewards`).

    Raises:
        Exception: under `FailFast`, the first failure (after cancelling the other groups);
            under any strategy, programming errors and cancellation.
    """
    strategy = FailFast() if strategy is None else strategy
    if max_concurrent_groups is not None and max_concurrent_groups < 1:
        raise ValueError(
            f"do_batch_rollouts.max_concurrent_groups: expected >= 1, got {max_concurrent_groups}"
        )
    failures: tuple[type[Exception], ...] = ()
    if not isinstance(strategy, FailFast):
        failures = (GroupRolloutError, *ROLLOUT_FAILURES, *strategy.failures)
    limit = asyncio.Semaphore(max_concurrent_groups or max(1, len(builders_P)))

    @future_safe(exceptions=failures)
    async def one_group(builder: EnvGroupBuilder) -> TrajectoryGroup:
        async with limit:
            return await do_group_rollout(builder, policy, strategy=strategy)

    async def run_group(builder: EnvGroupBuilder) -> IOResult[TrajectoryGroup, Exception]:
        return await one_group(builder)

    tasks = [asyncio.create_task(run_group(b)) for b in builders_P]
    try:
        done = await asyncio.gather(*tasks)
    finally:
        await _cancel_and_wait({t for t in tasks if not t.done()})
    return [_to_result(io).alt(_group_failure) for io in done]


def batch_rollout_error_metrics(outcomes_P: Sequence[GroupOutcome]) -> dict[str, float]:
    """Counts rollout failures of one batch (`rlpure.metrics` names; empty without failures).

    Returns:
        `rollout_errors/<ErrorType>` per captured trajectory error (in kept and dropped groups),
        `rollout_errors/total`, and `rollout_errors/groups_skipped` (dropped groups).
    """
    groups: list[TrajectoryGroup] = []
    skipped = 0
    for outcome in outcomes_P:
        match outcome:
            case Success(group):
                groups.append(group)
            case Failure(failure):
                skipped += 1
                # a dropped group contributes its errors, not trajectories
                groups.append(
                    TrajectoryGroup(
                        trajectories_G=(),
                        final_rewards_G=(),
                        metrics_G=(),
                        rollout_errors=failure.errors,
                    )
                )
    return metrics_lib.rollout_error_metrics(groups, groups_skipped=skipped)
