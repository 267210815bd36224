"""Rollout strategies: how the trajectories of one group are collected (`shell.rollouts`).

The cookbook's `rl/rollout_strategy.py`: `RolloutStrategy` (`execute`, `catches_group_errors`),
`FailFast`, `RetryOnFailure`, `MinViableGroup`, `RolloutResult`, `rollout_strategy_from_config`
and `default_rollout_strategy_for_model`, plus `do_single_rollout`, which they run per env.
Trajectories keep slot order: env `g` of `make_envs()` fills slot `g`, a retry refills it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import msgspec

from rlpure.records import RolloutError, Trajectory
from shell.completion import TokenCompleter
from shell.env import Env, EnvGroupBuilder
from shell.errors import BelowMinViableGroupError, ConfigError
from shell.rollouts._episode import run_rollout
from shell.rollouts._presets import model_defaults_to_agentic

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


def _cookbook_configuration_errors() -> tuple[type[BaseException], ...]:
    """tinker-cookbook's own `ConfigurationError`, when cookbook code is loaded in this process.

    Ported code raises ours (`shell.cookbook.exceptions.ConfigurationError` is `ConfigError`), but a
    ported env may still call the cookbook's modules (its renderers), which raise theirs. It is
    looked up in `sys.modules`, never imported: if no cookbook module ran, none was raised.
    """
    module = sys.modules.get("tinker_cookbook.exceptions")
    kind = getattr(module, "ConfigurationError", None)
    return (kind,) if isinstance(kind, type) and issubclass(kind, BaseException) else ()


def _is_fatal(exc: BaseException, fatal: tuple[type[BaseException], ...]) -> bool:
    """`exc` is one of `fatal`; the cookbook's `ConfigurationError` counts as our `ConfigError`."""
    if isinstance(exc, fatal):
        return True
    return ConfigError in fatal and isinstance(exc, _cookbook_configuration_errors())


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
            await cancel_and_wait({t for t in tasks if not t.done()})
            retrieve_exceptions(tasks)
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
        return _is_fatal(exc, self.fatal)

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
        return _is_fatal(exc, self.fatal)

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
    """Runs one episode of `env` with `policy`: `run_rollout(policy, env)`.

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


def rollout_error(exc: BaseException) -> RolloutError:
    return RolloutError(error_type=type(exc).__name__, error_message=str(exc))


async def cancel_and_wait(tasks: set[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


def retrieve_exceptions(tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Reads finished tasks' exceptions so asyncio does not log "never retrieved" for them."""
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()


@dataclass
class _Progress:
    """What a retrying collection holds so far; updated as its rollouts finish."""

    env_of_slot: list[Env]
    retries_left: int
    trajectory_of_slot: dict[int, Trajectory] = field(default_factory=dict)
    errors: list[RolloutError] = field(default_factory=list)


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
    floor = None
    if isinstance(strategy, MinViableGroup):
        floor = min_viable_floor(len(envs), min_successful=min_successful)
    progress = _Progress(env_of_slot=list(envs), retries_left=max_retries)
    slot_of: dict[asyncio.Task[Trajectory], int] = {}

    def launch(slot: int, env: Env) -> asyncio.Task[Trajectory]:
        progress.env_of_slot[slot] = env
        task = asyncio.create_task(_timed_rollout(policy, env, timeout))
        slot_of[task] = slot
        return task

    pending = {launch(slot, env) for slot, env in enumerate(envs)}
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=slot_of.__getitem__):
                exc = _failure_of(task, strategy)
                if exc is None:
                    progress.trajectory_of_slot[slot_of[task]] = task.result()
                elif _retries_failure(exc, progress, floor=floor, max_retries=max_retries):
                    fresh = await _make_envs(builder)
                    pending.add(launch(slot_of[task], fresh[0]))
    finally:
        await cancel_and_wait(pending)
        retrieve_exceptions(list(slot_of))
    return _collected_group(builder, progress, floor=floor, max_retries=max_retries)


def _failure_of(task: asyncio.Task[Trajectory], strategy: RolloutStrategy) -> Exception | None:
    """A finished rollout's retryable failure, or None when it succeeded.

    A cancellation, a `BaseException` that is not an `Exception` (`KeyboardInterrupt` and the
    like) and the strategy's fatal errors propagate.
    """
    if task.cancelled():
        task.result()  # a cancelled rollout: the cancellation propagates
    exc = task.exception()
    if exc is None:
        return None
    if not isinstance(exc, Exception) or strategy.is_fatal(exc):
        raise exc
    return exc


def _retries_failure(
    exc: Exception, progress: _Progress, *, floor: int | None, max_retries: int
) -> bool:
    """Records a failed rollout; True when it is retried (spending one retry).

    Retried while the budget lasts and, under a floor, while fewer than `floor` succeeded.
    Otherwise `RetryOnFailure` (no floor) re-raises `exc`, noting every failure on it, and
    `MinViableGroup` leaves the slot empty (False).
    """
    progress.errors.append(rollout_error(exc))
    succeeded = len(progress.trajectory_of_slot)
    if progress.retries_left > 0 and (floor is None or succeeded < floor):
        progress.retries_left -= 1
        logger.warning(
            "Rollout failed (%s: %s); retrying in a fresh env (%d retries left)",
            type(exc).__name__,
            exc,
            progress.retries_left,
        )
        return True
    if floor is None:
        logger.error(
            "Rollout failed (%s: %s) with the retry budget (%d) spent; dropping the group",
            type(exc).__name__,
            exc,
            max_retries,
        )
        exc.add_note(
            f"RetryOnFailure: retry budget spent ({len(progress.errors)} failures, "
            f"max_retries={max_retries}): "
            + ", ".join(f"{e.error_type}: {e.error_message}" for e in progress.errors)
        )
        raise exc
    logger.warning(
        "Rollout failed (%s: %s); not retried (%d/%d succeeded, floor %d, %d retries left)",
        type(exc).__name__,
        exc,
        succeeded,
        len(progress.env_of_slot),
        floor,
        progress.retries_left,
    )
    return False


def _collected_group(
    builder: EnvGroupBuilder, progress: _Progress, *, floor: int | None, max_retries: int
) -> RolloutResult:
    """The successful trajectories in slot order; `BelowMinViableGroupError` below `floor`."""
    succeeded = len(progress.trajectory_of_slot)
    if floor is not None and succeeded < floor:
        raise BelowMinViableGroupError(
            f"{type(builder).__name__}: only {succeeded}/{len(progress.env_of_slot)} rollouts "
            f"succeeded, below the minimum viable group size {floor} "
            f"({len(progress.errors)} failures, max_retries={max_retries}); dropping the group",
            errors=tuple(progress.errors),
        )
    slots = sorted(progress.trajectory_of_slot)
    return RolloutResult(
        trajectories=[progress.trajectory_of_slot[s] for s in slots],
        envs=[progress.env_of_slot[s] for s in slots],
        errors=progress.errors,
    )
