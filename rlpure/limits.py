"""Rollout-limit arithmetic: per-turn token budgets, budget stops, stop reasons, reward clamps.

The pure half of tinker-cookbook 0.6.1's `rl/rollout_runner.py` and `rl/rollouts.py` limit
logic; the shell's `shell.rollouts` holds the configuration records and the rollout loop that
calls these functions.

Conventions:
- Token counts are plain ints: `observation_tokens` is the length of the current observation
  (the whole rendered conversation, so it already counts earlier actions and injected turns),
  `sampled_tokens` the action tokens sampled so far in the episode.
- A limit of `None` is unlimited. A *cumulative* budget (trajectory or sampled tokens) whose
  remainder is `<= 1` counts as exhausted: a 1-token cap cannot make a useful turn.
- Stop reasons are strings; those this module returns are `rlpure.records.StopReason` members
  (a `StrEnum`, equal to their values). An env reports its reason as the one-hot metric
  `stop/<reason>` on its final transition.
- Axis letters: `G` trajectories of one group.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from rlpure.records import STOP_METRIC_PREFIX, StopReason

__all__ = [
    "ClampedRewards",
    "budget_stop_reason",
    "per_turn_token_budget",
    "skip_group_grading",
    "stop_reason_from_metrics",
    "zero_reward_on_limit",
]


def _remaining(limit: int | None, used: int) -> int | None:
    return None if limit is None else limit - used


def budget_stop_reason(
    *,
    observation_tokens: int,
    sampled_tokens: int,
    max_trajectory_tokens: int | None = None,
    max_sampled_tokens: int | None = None,
) -> StopReason | None:
    """The cumulative-budget stop before a turn, or None when both budgets leave room.

    The trajectory budget wins when both are exhausted.

    Args:
        observation_tokens: length of the observation the next turn would sample from.
        sampled_tokens: action tokens sampled so far.
        max_trajectory_tokens: observation + action budget, None for unlimited.
        max_sampled_tokens: action-only budget, None for unlimited.

    Returns:
        `"max_tokens"` when `max_trajectory_tokens - observation_tokens <= 1`, else
        `"max_sampled_tokens"` when `max_sampled_tokens - sampled_tokens <= 1`, else None.

    Examples:
        >>> budget_stop_reason(observation_tokens=9, sampled_tokens=0, max_trajectory_tokens=10)
        <StopReason.MAX_TOKENS: 'max_tokens'>
        >>> print(budget_stop_reason(observation_tokens=8, sampled_tokens=0,
        ...                          max_trajectory_tokens=10))
        None
    """
    trajectory_left = _remaining(max_trajectory_tokens, observation_tokens)
    if trajectory_left is not None and trajectory_left <= 1:
        return StopReason.MAX_TOKENS
    sampled_left = _remaining(max_sampled_tokens, sampled_tokens)
    if sampled_left is not None and sampled_left <= 1:
        return StopReason.MAX_SAMPLED_TOKENS
    return None


def per_turn_token_budget(
    *,
    observation_tokens: int,
    sampled_tokens: int,
    max_turn_tokens: int | None = None,
    max_trajectory_tokens: int | None = None,
    max_sampled_tokens: int | None = None,
) -> int | None:
    """The `max_tokens` cap for the next sampling call: the least of the limits that apply.

    `min(max_turn_tokens, max_trajectory_tokens - observation_tokens,
    max_sampled_tokens - sampled_tokens)` over the terms that are set; a cumulative term whose
    remainder is `<= 1` is left out (only reachable when a hook cleared the budget stop), so
    the cap is never a useless 1 or less. `max_turn_tokens` is a per-turn cap and always counts
    (`max_turn_tokens=1` is a valid "one token per turn").

    Returns:
        The cap, or None when no term applies (the completer's own limit holds).

    Examples:
        >>> per_turn_token_budget(observation_tokens=90, sampled_tokens=5, max_turn_tokens=32,
        ...                       max_trajectory_tokens=100, max_sampled_tokens=40)
        10
    """
    terms: list[int] = []
    if max_turn_tokens is not None:
        terms.append(max_turn_tokens)
    for left in (
        _remaining(max_trajectory_tokens, observation_tokens),
        _remaining(max_sampled_tokens, sampled_tokens),
    ):
        if left is not None and left > 1:
            terms.append(left)
    return min(terms) if terms else None


def stop_reason_from_metrics(metrics: Mapping[str, float | int]) -> str | None:
    """The reason of the first `stop/<reason>` key in `metrics` (whatever its value), or None.

    Examples:
        >>> stop_reason_from_metrics({"correct": 1.0, "stop/completed": 1.0})
        'completed'
    """
    for key in metrics:
        if key.startswith(STOP_METRIC_PREFIX):
            return key[len(STOP_METRIC_PREFIX) :]
    return None


class ClampedRewards(NamedTuple):
    """Group rewards after grade-then-clamp.

    Attributes:
        final_rewards_G: the group-level reward of each trajectory, lowered where clamped.
        clamped_G: whether each trajectory's total was clamped to 0.0.
    """

    final_rewards_G: tuple[float, ...]
    clamped_G: tuple[bool, ...]


def zero_reward_on_limit(
    step_rewards_G: Sequence[Iterable[float]],
    final_rewards_G: Sequence[float],
    stop_reasons_G: Sequence[str | None],
    *,
    limit_stop_reasons: Iterable[str],
) -> ClampedRewards:
    """Clamps the total reward of limit-stopped trajectories to `min(total, 0.0)`.

    A trajectory's total is `sum(step rewards) + final reward`. For a trajectory whose stop
    reason is in `limit_stop_reasons` and whose total is `> 0`, the final (group-level) reward
    becomes `-sum(step rewards)`, which makes the total exactly 0.0; a total `<= 0` passes
    unchanged, so the grader's ordering among failures survives (tinker-cookbook's
    `TerminationRewardPolicy.zero_reward_on_limit`).

    Args:
        step_rewards_G: the per-step rewards of each trajectory (summed left to right from 0,
            as the cookbook sums).
        final_rewards_G: the graded group-level reward of each trajectory.
        stop_reasons_G: each trajectory's stop reason (None: unknown, never clamped).
        limit_stop_reasons: the stop reasons that count as a limit stop.

    Returns:
        The (possibly lowered) final rewards and which trajectories were clamped.

    Raises:
        ValueError: when the three per-trajectory sequences differ in length.

    Examples:
        >>> zero_reward_on_limit([[0.5], [0.5], [0.0]], [1.0, -2.0, 1.0],
        ...                      ["max_turns", "max_turns", None],
        ...                      limit_stop_reasons=["max_turns"])
        ClampedRewards(final_rewards_G=(-0.5, -2.0, 1.0), clamped_G=(True, False, False))
    """
    if not len(step_rewards_G) == len(final_rewards_G) == len(stop_reasons_G):
        raise ValueError(
            f"zero_reward_on_limit: step_rewards_G has {len(step_rewards_G)} items, "
            f"final_rewards_G {len(final_rewards_G)}, stop_reasons_G {len(stop_reasons_G)}; "
            "they must be equal"
        )
    limits = set(limit_stop_reasons)
    rewards: list[float] = []
    clamped: list[bool] = []
    for steps, final, reason in zip(step_rewards_G, final_rewards_G, stop_reasons_G, strict=True):
        step_sum = sum(steps)
        if reason is not None and reason in limits and step_sum + final > 0.0:
            rewards.append(float(-step_sum))
            clamped.append(True)
        else:
            rewards.append(final)
            clamped.append(False)
    return ClampedRewards(final_rewards_G=tuple(rewards), clamped_G=tuple(clamped))


def skip_group_grading(
    stop_reasons_G: Sequence[str | None],
    *,
    skip_grading_on_timeout: bool,
    zero_reward_on_limit: bool,
    limit_stop_reasons: Iterable[str],
) -> bool:
    """Whether a group's grading call can be skipped (every reward would clamp to 0 anyway).

    True only when skipping is asked for, the clamp is on, `rollout_timeout` is a limit stop,
    and the group is non-empty with **every** trajectory stopped by `rollout_timeout` (grading
    is one call for the whole group, so one member needing a grade keeps the call).

    Examples:
        >>> skip_group_grading(["rollout_timeout"] * 2, skip_grading_on_timeout=True,
        ...                    zero_reward_on_limit=True, limit_stop_reasons=["rollout_timeout"])
        True
    """
    return (
        skip_grading_on_timeout
        and zero_reward_on_limit
        and StopReason.ROLLOUT_TIMEOUT in set(limit_stop_reasons)
        and len(stop_reasons_G) > 0
        and all(reason == StopReason.ROLLOUT_TIMEOUT for reason in stop_reasons_G)
    )
