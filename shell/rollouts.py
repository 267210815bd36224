"""Rollouts: one episode, one group under a failure strategy, and a batch of groups.

The semantics are tinker-cookbook 0.6.1's (`rl/rollout_strategy.py`, `rl/rollouts.py`), with
the cookbook's names, call shapes and defaults, so cookbook code ports by an import rewrite.

Conventions:
- `do_single_rollout(policy, env)` is `shell.limits.run_rollout(policy, env)`, the unconfigured
  single-episode loop (actions reach `Env.step` as `list[int]`, every step becomes a
  `rlpure.records.Transition`).
- A `RolloutStrategy` owns the collection of a group's trajectories (`execute`, which calls
  `make_envs` itself, so retries get fresh envs) and says whether group-level errors skip the
  group (`catches_group_errors`):
  `FailFast` — the first exception fails the group, cancels its siblings and propagates;
  `RetryOnFailure(max_retries=3, per_rollout_timeout=0)` — **any** `Exception` of a rollout
  (or a per-rollout timeout, a `TimeoutError`) is retried in a fresh env while the group's
  budget lasts; once spent, the next failure cancels the rest and re-raises (all-or-nothing);
  `MinViableGroup(min_successful=None, max_retries=3, per_rollout_timeout=None)` — retries only
  while fewer than the floor (`⌈0.75·G⌉`) succeeded; keeps a partial group at or above it and
  raises `AllTrajectoriesFailedError` below it.
  `asyncio.CancelledError` always propagates; so do the strategy's `fatal` types (default
  `(ConfigError,)`, a deliberate difference: the cookbook retries even configuration errors;
  pass `fatal=()` for its behaviour).
- `do_group_rollout(env_group_builder, policy, strategy=None, termination=None)`: the strategy
  collects, `compute_group_rewards` scores (bounded by `termination.grader_timeout_seconds`,
  skipped when every trajectory timed out and would be clamped anyway), limit-stopped
  trajectories are clamped to `min(total reward, 0)` (`zero_reward_on_limit`), then `cleanup()`
  runs exactly once — shielded from cancellation, so a slow cleanup finishes even when the
  rollout is cancelled (the cancellation is re-raised after it).
- Group errors become data one level up: `do_group_rollout_and_filter_constant_reward` returns
  `None` for a skipped group (cookbook), `do_batch_rollouts` one `returns.result.Result` per
  group (`Failure(GroupFailure)` for a skipped one). A group is skipped on
  `AllTrajectoriesFailedError` under every strategy, and on any other non-fatal `Exception`
  under a strategy with `catches_group_errors`; otherwise the error propagates.
- Error counts: `RolloutErrorCounter` accumulates `rollout_errors/<ErrorType>`,
  `rollout_errors/total` and `rollout_errors/groups_skipped` across calls, as the cookbook's;
  a skipped group counts once in `groups_skipped` (its trajectory errors are not counted).

Deliberate differences from the cookbook (each strictly safer, none changes a kept/skipped
outcome): trajectories keep **slot order** (env `g` of `make_envs()` fills slot `g`, a retry
refills it; the cookbook keeps completion order, which varies run to run); `FailFast` cancels
the sibling rollouts of a failed one (the cookbook's `asyncio.gather` leaves them running after
`cleanup()` released their resources) and takes an optional `per_rollout_timeout`; a `cleanup()`
that raises while another error propagates is logged and noted on that error instead of
replacing it (the cookbook warns that it masks the rollout error); invalid options
(`max_retries < 0`, a `MinViableGroup` timeout <= 0 that would time out every rollout, a floor
< 1, a group of zero envs) raise `ValueError` at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, TypeAlias

import msgspec
from returns.result import Failure, Result, Success

from rlpure.records import Metrics, RolloutError, Trajectory, TrajectoryGroup
from shell.clients import SamplingClient
from shell.completers import TinkerTokenCompleter, TokenCompleter
from shell.env import Env, EnvGroupBuilder
from shell.errors import AllTrajectoriesFailedError, BelowMinViableGroupError, ConfigError
from shell.limits import (
    TerminationRewardPolicy,
    apply_zero_reward_on_limit,
    model_defaults_to_agentic,
    run_rollout,
    should_skip_group_grading,
)

__all__ = [
    "FailFast",
    "GroupFailure",
    "GroupOutcome",
    "MinViableGroup",
    "RetryOnFailure",
    "RolloutErrorCounter",
    "RolloutResult",
    "RolloutStrategy",
    "batch_rollout_error_metrics",
    "default_rollout_strategy_for_model",
    "do_batch_rollouts",
    "do_group_rollout",
    "do_group_rollout_and_filter_constant_reward",
    "do_single_rollout",
    "min_viable_floor",
    "rollout_strategy_from_config",
]

logger = logging.getLogger(__name__)

# --- results and strategies --------------------------------------------------------------------


class RolloutResult(msgspec.Struct, frozen=True):
    """What a `RolloutStrategy` collected for one group (the cookbook's `RolloutResult`).

    Positional construction is allowed (not `kw_only`) because cookbook strategies build it so.

    Attributes:
        trajectories: the successful trajectories.
        envs: the env of each trajectory, same order.
        errors: the failures met on the way (retried or accepted); empty when none failed.
    """

    trajectories: Sequence[Trajectory]
    envs: Sequence[Env]
    errors: Sequence[RolloutError]


class RolloutStrategy(ABC):
    """How the trajectories of one group are collected (the cookbook's `RolloutStrategy`).

    Subclasses implement `execute`, which makes the envs (`make_envs`, again for a retry), runs
    the rollouts and returns a `RolloutResult`; `do_group_rollout` scores and cleans up.
    """

    @property
    def catches_group_errors(self) -> bool:
        """Whether group-level errors (`make_envs`, `compute_group_rewards`) skip the group."""
        return False

    def is_fatal(self, exc: BaseException) -> bool:
        """Whether `exc` propagates even where this strategy would skip the group."""
        del exc
        return False

    @abstractmethod
    async def execute(
        self, env_group_builder: EnvGroupBuilder, policy: TokenCompleter
    ) -> RolloutResult:
        """Makes the group's envs, runs their rollouts, and returns what survived.

        Args:
            env_group_builder: makes the envs (again for a retry).
            policy: samples actions.

        Returns:
            The successful trajectories with their envs, and the failures met.
        """


@dataclass(frozen=True)
class FailFast(RolloutStrategy):
    """Any exception fails the group at once, cancels its sibling rollouts, and propagates.

    Attributes:
        per_rollout_timeout: seconds before one rollout is cancelled with a `TimeoutError`
            (which fails the group like any error); None (default, as the cookbook's
            `FailFast`, which has no timeout) disables it.
    """

    _: KW_ONLY
    per_rollout_timeout: float | None = None

    def __post_init__(self) -> None:
        _check_timeout("FailFast", self.per_rollout_timeout)

    async def execute(
        self, env_group_builder: EnvGroupBuilder, policy: TokenCompleter
    ) -> RolloutResult:
        """Runs every rollout of the group concurrently; the first exception propagates."""
        envs = await _make_envs(env_group_builder)
        tasks = [
            asyncio.create_task(_timed_rollout(policy, env, self.per_rollout_timeout))
            for env in envs
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in tasks:  # slot order: the first failed slot's exception propagates
                if task.done() and (task.cancelled() or task.exception() is not None):
                    task.result()
            trajectories = [task.result() for task in tasks]
        finally:
            await _cancel_and_wait({t for t in tasks if not t.done()})
            _retrieve_exceptions(tasks)
        return RolloutResult(trajectories=trajectories, envs=envs, errors=[])


@dataclass(frozen=True)
class RetryOnFailure(RolloutStrategy):
    """Retry failed or timed-out rollouts in fresh envs; all-or-nothing once the budget is spent.

    Any `Exception` of a rollout counts as a failure (as in the cookbook), except the `fatal`
    types, which propagate at once; `asyncio.CancelledError` always propagates.

    Attributes:
        max_retries: retry budget shared by the whole group (>= 0).
        per_rollout_timeout: seconds before one rollout is cancelled and counted as a failure
            (a `TimeoutError`); 0 (default) or None disables it.
        fatal: exception types that are not rollout failures (keyword-only; default
            `(ConfigError,)`; `()` retries every `Exception`, as the cookbook).
    """

    max_retries: int = 3
    per_rollout_timeout: float | None = 0
    _: KW_ONLY
    fatal: tuple[type[BaseException], ...] = (ConfigError,)

    def __post_init__(self) -> None:
        _check_retries("RetryOnFailure", self.max_retries)
        if self.per_rollout_timeout is not None and self.per_rollout_timeout < 0:
            raise ValueError(
                "RetryOnFailure.per_rollout_timeout: expected >= 0 (0 disables it) or None, "
                f"got {self.per_rollout_timeout}"
            )

    @property
    def catches_group_errors(self) -> bool:
        return True

    def is_fatal(self, exc: BaseException) -> bool:
        return isinstance(exc, self.fatal)

    async def execute(
        self, env_group_builder: EnvGroupBuilder, policy: TokenCompleter
    ) -> RolloutResult:
        """Runs the group, retrying failures while the budget lasts (see the class docstring)."""
        timeout = self.per_rollout_timeout or None
        return await _collect_with_retries(
            env_group_builder,
            policy,
            strategy=self,
            max_retries=self.max_retries,
            timeout=timeout,
            min_successful=None,
        )


@dataclass(frozen=True)
class MinViableGroup(RolloutStrategy):
    """Accept a partial group once a floor of rollouts succeeded; retry only below the floor.

    Any `Exception` of a rollout counts as a failure (as in the cookbook), except the `fatal`
    types; below the floor after every rollout and retry finished, the group is dropped with
    `BelowMinViableGroupError` (an `AllTrajectoriesFailedError`).

    Attributes:
        min_successful: the floor (>= 1); None means `⌈0.75·G⌉` for a group of `G` envs.
        max_retries: retry budget shared by the group, spent only while the floor is unmet.
        per_rollout_timeout: seconds (> 0) before one rollout counts as failed; None disables it.
        fatal: exception types that are not rollout failures (keyword-only; default
            `(ConfigError,)`; `()` for the cookbook's behaviour).
    """

    min_successful: int | None = None
    max_retries: int = 3
    per_rollout_timeout: float | None = None
    _: KW_ONLY
    fatal: tuple[type[BaseException], ...] = (ConfigError,)

    def __post_init__(self) -> None:
        _check_retries("MinViableGroup", self.max_retries)
        _check_timeout("MinViableGroup", self.per_rollout_timeout)
        if self.min_successful is not None and self.min_successful < 1:
            raise ValueError(
                f"MinViableGroup.min_successful: expected >= 1 or None, got {self.min_successful}"
            )

    @property
    def catches_group_errors(self) -> bool:
        return True

    def is_fatal(self, exc: BaseException) -> bool:
        return isinstance(exc, self.fatal)

    async def execute(
        self, env_group_builder: EnvGroupBuilder, policy: TokenCompleter
    ) -> RolloutResult:
        """Runs the group, retrying failures only while the floor is unmet."""
        return await _collect_with_retries(
            env_group_builder,
            policy,
            strategy=self,
            max_retries=self.max_retries,
            timeout=self.per_rollout_timeout,
            min_successful=self.min_successful,
        )


def _check_retries(name: str, max_retries: int) -> None:
    if max_retries < 0:
        raise ValueError(f"{name}.max_retries: expected >= 0, got {max_retries}")


def _check_timeout(name: str, timeout: float | None) -> None:
    if timeout is not None and not timeout > 0:
        raise ValueError(
            f"{name}.per_rollout_timeout: expected > 0 or None, got {timeout} "
            "(a deadline of 0 would time out every rollout at once)"
        )


def min_viable_floor(group_size: int, *, min_successful: int | None = None) -> int:
    """The MinViableGroup floor: `min_successful`, or `⌈0.75·G⌉` (G=4 → 3, G=8 → 6).

    Examples:
        >>> [min_viable_floor(g) for g in (1, 2, 4, 8, 16)]
        [1, 2, 3, 6, 12]
    """
    if min_successful is not None:
        return min_successful
    return math.ceil(0.75 * group_size)


def rollout_strategy_from_config(
    rollout_error_tolerance: bool | RolloutStrategy,
) -> RolloutStrategy:
    """The strategy a `Config.rollout_error_tolerance` value names (the cookbook's mapping).

    `False` → `FailFast()`, `True` → `RetryOnFailure()` (3 retries), a strategy → itself.

    Raises:
        ConfigError: any other value (the cookbook's `ConfigurationError`, the same class).

    Examples:
        >>> rollout_strategy_from_config(True) == RetryOnFailure(max_retries=3)
        True
    """
    if isinstance(rollout_error_tolerance, RolloutStrategy):
        return rollout_error_tolerance
    if rollout_error_tolerance is False:
        return FailFast()
    if rollout_error_tolerance is True:
        return RetryOnFailure()
    raise ConfigError(
        f"Invalid rollout_error_tolerance value: {rollout_error_tolerance!r} "
        "(expected True, False or a RolloutStrategy)"
    )


def default_rollout_strategy_for_model(model_name: str) -> RolloutStrategy:
    """The strategy a model gets when none is configured (the cookbook's preset).

    `thinkingmachines/Inkling` models (and their `:`-suffixed variants) get `MinViableGroup()`,
    every other model `FailFast()`.
    """
    return MinViableGroup() if model_defaults_to_agentic(model_name) else FailFast()


# --- single rollout ----------------------------------------------------------------------------


async def do_single_rollout(policy: TokenCompleter, env: Env) -> Trajectory:
    """Runs one episode of `env` with `policy`: `shell.limits.run_rollout(policy, env)`.

    The cookbook's `do_single_rollout`, the unconfigured loop (limits only when the env
    advertises them); actions reach `env.step` as `list[int]`. Use `run_rollout` itself for
    budgets and hooks.
    """
    return await run_rollout(policy, env)


async def _timed_rollout(policy: TokenCompleter, env: Env, timeout: float | None) -> Trajectory:
    """`do_single_rollout` under a deadline; an expired deadline raises `TimeoutError`."""
    if timeout is None:
        return await do_single_rollout(policy, env)
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            return await do_single_rollout(policy, env)
    except TimeoutError:
        if deadline.expired():  # ours, not a TimeoutError raised by the env or the sampler
            raise TimeoutError(
                f"rollout exceeded its per_rollout_timeout of {timeout:g} s"
            ) from None
        raise


# --- collecting a group ------------------------------------------------------------------------


async def _make_envs(builder: EnvGroupBuilder) -> list[Env]:
    envs = list(await builder.make_envs())
    if not envs:
        raise ValueError(f"{type(builder).__name__}.make_envs: returned no envs")
    return envs


def _rollout_error(exc: BaseException) -> RolloutError:
    return RolloutError(error_type=type(exc).__name__, error_message=str(exc))


async def _cancel_and_wait(tasks: set[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


def _retrieve_exceptions(tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Reads finished tasks' exceptions so asyncio does not log "never retrieved" for them."""
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()


async def _collect_with_retries(
    builder: EnvGroupBuilder,
    policy: TokenCompleter,
    *,
    strategy: RolloutStrategy,
    max_retries: int,
    timeout: float | None,
    min_successful: int | None,
) -> RolloutResult:
    """`RetryOnFailure` (`min_successful` None: no floor) and `MinViableGroup` collection."""
    envs = await _make_envs(builder)
    group_size = len(envs)
    floor = None
    if isinstance(strategy, MinViableGroup):
        floor = min_viable_floor(group_size, min_successful=min_successful)
    slot_of: dict[asyncio.Task[Trajectory], int] = {}
    env_of_slot: list[Env] = list(envs)
    trajectory_of_slot: dict[int, Trajectory] = {}
    errors: list[RolloutError] = []
    retries_left = max_retries

    def launch(slot: int, env: Env) -> asyncio.Task[Trajectory]:
        env_of_slot[slot] = env
        task = asyncio.create_task(_timed_rollout(policy, env, timeout))
        slot_of[task] = slot
        return task

    pending = {launch(slot, env) for slot, env in enumerate(envs)}
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=slot_of.__getitem__):
                if task.cancelled():
                    task.result()  # a cancelled rollout: the cancellation propagates
                exc = task.exception()
                if exc is None:
                    trajectory_of_slot[slot_of[task]] = task.result()
                    continue
                if not isinstance(exc, Exception) or strategy.is_fatal(exc):
                    raise exc  # KeyboardInterrupt and the like, and fatal errors, propagate
                errors.append(_rollout_error(exc))
                below_floor = floor is None or len(trajectory_of_slot) < floor
                if retries_left > 0 and below_floor:
                    retries_left -= 1
                    logger.warning(
                        "Rollout failed (%s: %s); retrying in a fresh env (%d retries left)",
                        type(exc).__name__,
                        exc,
                        retries_left,
                    )
                    fresh = await _make_envs(builder)
                    pending.add(launch(slot_of[task], fresh[0]))
                elif floor is None:
                    logger.error(
                        "Rollout failed (%s: %s) with the retry budget (%d) spent; "
                        "dropping the group",
                        type(exc).__name__,
                        exc,
                        max_retries,
                    )
                    exc.add_note(
                        f"RetryOnFailure: retry budget spent ({len(errors)} failures, "
                        f"max_retries={max_retries}): "
                        + ", ".join(f"{e.error_type}: {e.error_message}" for e in errors)
                    )
                    raise exc
                else:
                    logger.warning(
                        "Rollout failed (%s: %s); not retried (%d/%d succeeded, floor %d, "
                        "%d retries left)",
                        type(exc).__name__,
                        exc,
                        len(trajectory_of_slot),
                        group_size,
                        floor,
                        retries_left,
                    )
    finally:
        await _cancel_and_wait(pending)
        _retrieve_exceptions(list(slot_of))

    if floor is not None and len(trajectory_of_slot) < floor:
        raise BelowMinViableGroupError(
            f"{type(builder).__name__}: only {len(trajectory_of_slot)}/{group_size} rollouts "
            f"succeeded, below the minimum viable group size {floor} ({len(errors)} failures, "
            f"max_retries={max_retries}); dropping the group",
            errors=tuple(errors),
        )
    slots = sorted(trajectory_of_slot)
    return RolloutResult(
        trajectories=[trajectory_of_slot[s] for s in slots],
        envs=[env_of_slot[s] for s in slots],
        errors=errors,
    )


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


def _skips_group(strategy: RolloutStrategy, exc: Exception) -> bool:
    """Whether a group that raised `exc` is skipped rather than failing the run."""
    if strategy.is_fatal(exc):
        return False
    return isinstance(exc, AllTrajectoriesFailedError) or strategy.catches_group_errors


def _all_same(values: Sequence[float]) -> bool:
    return all(v == values[0] for v in values)


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
        rewards when filtering.
    """
    del enable_logging
    strategy = FailFast() if strategy is None else strategy
    policy = TinkerTokenCompleter(sampling_client, max_tokens=max_tokens, temperature=temperature)
    try:
        group = await do_group_rollout(env_group_builder, policy, strategy, termination)
    except Exception as exc:
        if not _skips_group(strategy, exc):
            raise
        logger.warning("Rollout error (%s), skipping group: %s", type(exc).__name__, exc)
        return None
    if do_remove_constant_reward_groups and _all_same(group.get_total_rewards()):
        return None
    return group


# --- batches and error counts ------------------------------------------------------------------


class GroupFailure(msgspec.Struct, frozen=True, kw_only=True):
    """A group that was skipped: why, and the trajectory errors known when it was dropped.

    Attributes:
        error_type: class name of the exception that failed the group.
        error_message: its message.
        errors: for a `GroupRolloutError` (below the floor), the trajectory failures it
            carries; otherwise the failing exception itself as one `RolloutError`.
    """

    error_type: str
    error_message: str
    errors: tuple[RolloutError, ...] = ()


GroupOutcome: TypeAlias = Result[TrajectoryGroup, GroupFailure]


def _group_failure(exc: Exception) -> GroupFailure:
    errors = getattr(exc, "errors", None)
    if not isinstance(errors, tuple):
        errors = (_rollout_error(exc),)
    return GroupFailure(error_type=type(exc).__name__, error_message=str(exc), errors=errors)


async def do_batch_rollouts(
    builders_P: Sequence[EnvGroupBuilder],
    policy: TokenCompleter,
    *,
    strategy: RolloutStrategy | None = None,
    termination: TerminationRewardPolicy | None = None,
    max_concurrent_groups: int | None = None,
) -> list[GroupOutcome]:
    """Runs all groups of a batch concurrently, at most `max_concurrent_groups` at a time.

    Args:
        builders_P: one builder per problem.
        policy: samples actions.
        strategy: failure handling; `FailFast()` by default.
        termination: see `do_group_rollout`.
        max_concurrent_groups: bound on groups in flight (None: unbounded).

    Returns:
        One outcome per builder, same order: `Success(TrajectoryGroup)` or `Failure(GroupFailure)`
        for a skipped group (the cookbook's skip rule, see
        `do_group_rollout_and_filter_constant_reward`).

    Raises:
        Exception: a group error that is not skipped (after cancelling the other groups, each
            of which still cleans up once); cancellation.
    """
    strategy = FailFast() if strategy is None else strategy
    if max_concurrent_groups is not None and max_concurrent_groups < 1:
        raise ValueError(
            f"do_batch_rollouts.max_concurrent_groups: expected >= 1, got {max_concurrent_groups}"
        )
    limit = asyncio.Semaphore(max_concurrent_groups or max(1, len(builders_P)))

    async def one_group(builder: EnvGroupBuilder) -> GroupOutcome:
        async with limit:
            try:
                return Success(await do_group_rollout(builder, policy, strategy, termination))
            except Exception as exc:
                if not _skips_group(strategy, exc):
                    raise
                logger.warning("Rollout error (%s), skipping group: %s", type(exc).__name__, exc)
                return Failure(_group_failure(exc))

    tasks = [asyncio.create_task(one_group(b)) for b in builders_P]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        await _cancel_and_wait({t for t in tasks if not t.done()})
        _retrieve_exceptions(tasks)


@dataclass
class RolloutErrorCounter:
    """Running rollout-error counts over every result ingested (the cookbook's counter).

    Mutable by design (shell-side state, one per run or per evaluation).

    Examples:
        >>> counter = RolloutErrorCounter()
        >>> counter.ingest(None)
        >>> counter.get_metrics()
        {'rollout_errors/total': 0.0, 'rollout_errors/groups_skipped': 1.0}
    """

    _counts: Counter[str] = field(default_factory=Counter)
    _groups_skipped: int = 0

    def ingest(self, result: TrajectoryGroup | GroupOutcome | None) -> None:
        """Adds one group's result: its `rollout_errors`, or one skipped group.

        Args:
            result: a group, or None for a skipped one (the cookbook's form); or a
                `GroupOutcome` (`Success(group)`, `Failure(...)` counts as skipped).
        """
        if isinstance(result, Success):
            result = result.unwrap()
        if not isinstance(result, TrajectoryGroup):  # None or Failure(...): a skipped group
            self._groups_skipped += 1
            return
        for err in result.rollout_errors:
            self._counts[err.error_type] += 1

    def get_metrics(self, prefix: str = "rollout_errors") -> dict[str, float]:
        """`{prefix}/<ErrorType>` counts, `{prefix}/total`, `{prefix}/groups_skipped`.

        Running totals since the counter was made; `{}` while nothing failed.
        """
        out: dict[str, float] = {}
        if self._counts or self._groups_skipped > 0:
            for error_type, count in self._counts.items():
                out[f"{prefix}/{error_type}"] = float(count)
            out[f"{prefix}/total"] = float(sum(self._counts.values()))
            out[f"{prefix}/groups_skipped"] = float(self._groups_skipped)
        return out


def batch_rollout_error_metrics(outcomes_P: Sequence[GroupOutcome]) -> dict[str, float]:
    """The error counts of one batch alone (a fresh `RolloutErrorCounter` over `outcomes_P`)."""
    counter = RolloutErrorCounter()
    for outcome in outcomes_P:
        counter.ingest(outcome)
    return counter.get_metrics()
