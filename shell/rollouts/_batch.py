"""Batches of groups as `returns` results, and rollout-error counts (`shell.rollouts`).

`do_batch_rollouts` (what the training loop calls) gives one `Result` per group;
`RolloutErrorCounter` is the cookbook's running error counter.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

import msgspec
from returns.result import Failure, Result, Success

from rlpure.records import RolloutError, TrajectoryGroup
from shell.completion import TokenCompleter
from shell.env import EnvGroupBuilder
from shell.rollouts._group import (
    do_group_rollout,
    get_rollout_executor,
    run_in_rollout_executor,
    skips_group,
)
from shell.rollouts._policies import TerminationRewardPolicy
from shell.rollouts._strategies import (
    FailFast,
    RolloutStrategy,
    cancel_and_wait,
    retrieve_exceptions,
    rollout_error,
)
from shell.timing import span

logger = logging.getLogger(__name__)


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
"""One group of a batch: `Success(TrajectoryGroup)`, or `Failure(GroupFailure)` if skipped."""


def _group_failure(exc: Exception) -> GroupFailure:
    errors = getattr(exc, "errors", None)
    if not isinstance(errors, tuple):
        errors = (rollout_error(exc),)
    return GroupFailure(error_type=type(exc).__name__, error_message=str(exc), errors=errors)


@dataclass(frozen=True)
class _GroupTask:
    """The inputs of one group of a batch (pickleable when they are, for a process pool)."""

    policy: TokenCompleter
    builder: EnvGroupBuilder
    strategy: RolloutStrategy
    termination: TerminationRewardPolicy | None


async def _group_outcome(task: _GroupTask) -> GroupOutcome:
    try:
        with span("do_group_rollout_and_filter_constant_reward"):  # the cookbook's span name
            group = await do_group_rollout(
                task.builder, task.policy, task.strategy, task.termination
            )
    except Exception as exc:
        if not skips_group(task.strategy, exc):
            raise
        logger.warning("Rollout error (%s), skipping group: %s", type(exc).__name__, exc)
        return Failure(_group_failure(exc))
    return Success(group)


def _run_group_task(task: _GroupTask) -> GroupOutcome:
    """Executor entry point: one group of a batch in a fresh event loop of the worker."""
    return asyncio.run(_group_outcome(task))


async def do_group_rollout_outcome(
    builder: EnvGroupBuilder,
    policy: TokenCompleter,
    *,
    strategy: RolloutStrategy | None = None,
    termination: TerminationRewardPolicy | None = None,
) -> GroupOutcome:
    """One group as a `GroupOutcome`, in the rollout executor when one is set.

    What `do_batch_rollouts` does for each of its groups, for loops that start groups one at
    a time (streaming minibatches, async training): `Success(group)`, or `Failure(GroupFailure)`
    for a group the strategy skips.

    Raises:
        Exception: a group error that is not skipped; cancellation.
    """
    task = _GroupTask(
        policy=policy,
        builder=builder,
        strategy=FailFast() if strategy is None else strategy,
        termination=termination,
    )
    executor = get_rollout_executor()
    if executor is None:
        return await _group_outcome(task)
    return await run_in_rollout_executor(executor, _run_group_task, task)


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
        max_concurrent_groups: bound on groups in flight (None: unbounded), also with a
            rollout executor set (`set_rollout_executor`), which then runs each group.

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
    executor = get_rollout_executor()

    async def one_group(builder: EnvGroupBuilder) -> GroupOutcome:
        task = _GroupTask(
            policy=policy, builder=builder, strategy=strategy, termination=termination
        )
        async with limit:
            if executor is None:
                return await _group_outcome(task)
            return await run_in_rollout_executor(executor, _run_group_task, task)

    tasks = [asyncio.create_task(one_group(b)) for b in builders_P]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        await cancel_and_wait({t for t in tasks if not t.done()})
        retrieve_exceptions(tasks)


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
