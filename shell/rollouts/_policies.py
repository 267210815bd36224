"""The rollout policy records: `RolloutLimits`, `ParseErrorPolicy`, `TerminationRewardPolicy`.

tinker-cookbook 0.6.1's `rl/rollout_limits.py` (names, fields, defaults, validation), as chz
classes so they nest in a chz `Config` and take overrides (`limits.max_turns=5`). A
default-constructed record changes nothing: every limit is `None` (unlimited). `run_rollout`
enforces them in the order `_episode` documents; after sampling a `"length"` stop is handled
before the cumulative budgets, so a truncated turn that also exhausts the sampled budget reports
`max_sampled_tokens`.

Validation errors name the record and the field (`RolloutLimits.max_turns must be a positive
value or None (unlimited), got 0`); the cookbook's name chz's private attribute and accept a
string or float turn count.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import chz

from rlpure import limits as limits_lib
from rlpure.records import Metrics, StopReason, Trajectory

__all__ = [
    "DEFAULT_LIMIT_STOP_REASONS",
    "DEFAULT_RETRY_MESSAGE_TEMPLATE",
    "ZERO_REWARD_ON_LIMIT_METRIC_KEY",
    "ParseErrorPolicy",
    "RolloutLimits",
    "TerminationRewardPolicy",
    "apply_zero_reward_on_limit",
    "should_skip_group_grading",
]

ZERO_REWARD_ON_LIMIT_METRIC_KEY = "zero_reward_on_limit"
"""Group metric marking a trajectory whose total reward was clamped to 0.0."""


def _where(obj: Any, attr: str) -> str:
    """`Record.field` for a chz validator's `attr` (chz stores fields as `X_<name>`)."""
    return f"{type(obj).__name__}.{attr.removeprefix('X_')}"


def _real(obj: Any, attr: str, *, integer: bool) -> Any:
    value = getattr(obj, attr)
    kinds: tuple[type, ...] = (numbers.Integral,) if integer else (numbers.Real,)
    if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
        expected = "an int" if integer else "a number"
        raise TypeError(
            f"{_where(obj, attr)}: expected {expected} or None, got {type(value).__name__} "
            f"{value!r}"
        )
    if isinstance(value, float) and math.isnan(value):
        raise ValueError(f"{_where(obj, attr)}: expected a number, got nan")
    return value


def _positive_int_or_none(obj: Any, attr: str) -> None:
    value = _real(obj, attr, integer=True)
    if value is not None and value <= 0:
        raise ValueError(
            f"{_where(obj, attr)} must be a positive value or None (unlimited), got {value!r}"
        )


def _positive_seconds_or_none(obj: Any, attr: str) -> None:
    value = _real(obj, attr, integer=False)
    if value is not None and value <= 0:
        raise ValueError(
            f"{_where(obj, attr)} must be a positive value or None (unlimited), got {value!r}"
        )


def _non_negative(obj: Any, attr: str) -> None:
    value = _real(obj, attr, integer=False)
    if value is None:
        raise TypeError(f"{_where(obj, attr)}: expected a number, got None")
    if value < 0 or math.isinf(value):
        raise ValueError(f"{_where(obj, attr)} must be non-negative, got {value!r}")


def _non_negative_int(obj: Any, attr: str) -> None:
    value = _real(obj, attr, integer=True)
    if value is None:
        raise TypeError(f"{_where(obj, attr)}: expected an int, got None")
    if value < 0:
        raise ValueError(f"{_where(obj, attr)} must be non-negative, got {value!r}")


def _finite(obj: Any, attr: str) -> None:
    value = _real(obj, attr, integer=False)
    if value is None or not math.isfinite(value):
        raise ValueError(f"{_where(obj, attr)}: expected a finite number, got {value!r}")


def _bool(obj: Any, attr: str) -> None:
    value = getattr(obj, attr)
    if not isinstance(value, bool):
        raise TypeError(f"{_where(obj, attr)}: expected a bool, got {type(value).__name__}")


def _contains_details_placeholder(obj: Any, attr: str) -> None:
    value = getattr(obj, attr)
    if not isinstance(value, str):
        raise TypeError(f"{_where(obj, attr)}: expected a str, got {type(value).__name__}")
    if "{details}" not in value:
        raise ValueError(
            f"{_where(obj, attr)} must contain the '{{details}}' placeholder, got {value!r}"
        )


def _stop_reasons(obj: Any, attr: str) -> None:
    value = getattr(obj, attr)
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(
            f"{_where(obj, attr)}: expected a tuple of stop reasons (str), got "
            f"{type(value).__name__} {value!r}"
        )
    for i, reason in enumerate(value):
        if not isinstance(reason, str):
            raise TypeError(
                f"{_where(obj, attr)}[{i}]: expected a str, got {type(reason).__name__}"
            )


DEFAULT_RETRY_MESSAGE_TEMPLATE = "The previous message had a formatting issue.\nError: {details}"
"""Corrective user message injected after a recoverable (content) parse failure; `{details}`
becomes the parse-error detail."""


@chz.chz
class ParseErrorPolicy:
    """How a rollout responds to parse failures in the model's output.

    Structural failures (the response never produced its stop signal, so the message boundary
    is unknown) end the episode at once with `StopReason.PARSE_ERROR` and `terminal_reward`;
    they are never retried. Content failures (clean framing, unparsable tool calls) are retried
    up to `max_consecutive` times in a row: a corrective user message
    (`retry_message_template` with the details) is injected, its tokens count toward the
    trajectory budget, and the error turn's reward is `-penalty_per_error`; one more ends the
    episode with `PARSE_ERROR` and `terminal_reward`. A clean turn resets the count.

    The policy is applied by envs that parse (`set_parse_error_policy`, pushed by
    `run_rollout`); with none configured the one-shot semantics (`failed_parse_reward`,
    `terminate_on_parse_error`) apply unchanged.

    Attributes:
        max_consecutive: content failures in a row that are retried (0: the first ends it).
        retry_message_template: the corrective message; must contain `{details}`.
        penalty_per_error: subtracted on each retried error turn (>= 0).
        terminal_reward: reward of the turn that ends the episode with `PARSE_ERROR`.
        mask_error_turns: mark error turns `metrics["parse_error_masked"] = 1.0`, so their
            action tokens are left out of the loss.
    """

    max_consecutive: int = chz.field(
        default=0,
        validator=_non_negative_int,
        doc="Maximum consecutive content parse failures retried with a corrective message; "
        "0 means the first parse failure ends the episode. Structural failures always end it.",
    )
    retry_message_template: str = chz.field(
        default=DEFAULT_RETRY_MESSAGE_TEMPLATE,
        validator=_contains_details_placeholder,
        doc="Corrective user message after a recoverable parse failure; '{details}' is "
        "replaced with the error detail. Its tokens count toward the trajectory budget.",
    )
    penalty_per_error: float = chz.field(
        default=0.0,
        validator=_non_negative,
        doc="Penalty on each retried parse-error turn (its reward is -penalty_per_error); "
        "not applied on the terminal parse-error turn, which gets terminal_reward.",
    )
    terminal_reward: float = chz.field(
        default=0.0,
        validator=_finite,
        doc="Reward of the turn that ends the episode with StopReason.PARSE_ERROR.",
    )
    mask_error_turns: bool = chz.field(
        default=False,
        validator=_bool,
        doc="Mark parse-error turns with metrics['parse_error_masked']=1.0 so their action "
        "tokens are excluded from the training loss.",
    )


@chz.chz
class RolloutLimits:
    """Budgets bounding one rollout (one trajectory); every field `None` means unlimited.

    A limit that is hit ends the episode gracefully with its `StopReason` (the `stop/<reason>`
    metric on the last transition and `Trajectory.stop_reason`); none raises, except
    `sampling_turn_timeout_seconds` (a timed-out sampling call leaves no turn to keep).

    Attributes:
        max_turns: sampling calls per rollout; checked before each turn (`MAX_TURNS`).
        max_trajectory_tokens: observation + action tokens; the per-turn budget gets
            `max_trajectory_tokens - observation length` (`MAX_TOKENS`).
        max_sampled_tokens: cumulative action tokens; checked after LENGTH handling
            (`MAX_SAMPLED_TOKENS`).
        max_tool_calls: tool calls per rollout, enforced by envs that support it
            (`MAX_TOOL_CALLS`).
        max_turn_tokens: sampled tokens in one turn; a turn truncated at it does not end the
            rollout by itself.
        rollout_timeout_seconds: wall clock of the whole rollout; the partial trajectory is
            kept (`ROLLOUT_TIMEOUT`).
        sampling_turn_timeout_seconds: wall clock of one sampling call; exceeding it raises
            `SamplingTurnTimeoutError`.
    """

    max_turns: int | None = chz.field(
        default=None,
        validator=_positive_int_or_none,
        doc="Maximum agent turns (sampling calls) per rollout; checked before each turn, "
        "reaching it produces StopReason.MAX_TURNS.",
    )
    max_trajectory_tokens: int | None = chz.field(
        default=None,
        validator=_positive_int_or_none,
        doc="Maximum total tokens in the trajectory (observation and action); feeds the "
        "per-turn budget as (max_trajectory_tokens - observation length); exhausting it "
        "produces StopReason.MAX_TOKENS.",
    )
    max_sampled_tokens: int | None = chz.field(
        default=None,
        validator=_positive_int_or_none,
        doc="Maximum cumulative sampled (action-only) tokens per rollout; checked after LENGTH "
        "handling, exhausting it produces StopReason.MAX_SAMPLED_TOKENS.",
    )
    max_tool_calls: int | None = chz.field(
        default=None,
        validator=_positive_int_or_none,
        doc="Maximum tool calls per rollout, enforced by envs with set_max_tool_calls "
        "(pre-dispatch and mid-batch); exhausting it produces StopReason.MAX_TOOL_CALLS.",
    )
    max_turn_tokens: int | None = chz.field(
        default=None,
        validator=_positive_int_or_none,
        doc="Maximum sampled tokens in one turn; a turn truncated at this cap does not end "
        "the rollout by itself.",
    )
    rollout_timeout_seconds: float | None = chz.field(
        default=None,
        validator=_positive_seconds_or_none,
        doc="Wall-clock budget of the whole rollout; hitting it ends the episode gracefully "
        "with StopReason.ROLLOUT_TIMEOUT (the trajectory is kept and gradeable).",
    )
    sampling_turn_timeout_seconds: float | None = chz.field(
        default=None,
        validator=_positive_seconds_or_none,
        doc="Wall-clock budget of one sampling call; exceeding it raises "
        "SamplingTurnTimeoutError, so error-tolerant rollout strategies retry the rollout.",
    )


DEFAULT_LIMIT_STOP_REASONS: tuple[str, ...] = (
    StopReason.MAX_TOKENS,
    StopReason.MAX_SAMPLED_TOKENS,
    StopReason.MAX_TURNS,
    StopReason.MAX_TOOL_CALLS,
    StopReason.ROLLOUT_TIMEOUT,
)
"""The stop reasons that count as *limit* stops by default (a budget cut the episode off)."""


@chz.chz
class TerminationRewardPolicy:
    """How rewards interact with the stop reason a trajectory ended with.

    Grade normally, then clamp: a trajectory whose `stop_reason` is in `limit_stop_reasons` is
    graded like any other, then its total reward becomes `min(total, 0.0)` (through its
    group-level reward, marked `metrics["zero_reward_on_limit"] = 1.0`), so the model never
    profits from hitting a budget while negative grades keep their ordering. Applied by
    `shell.rollouts.do_group_rollout` after `compute_group_rewards` (see
    `apply_zero_reward_on_limit`, `should_skip_group_grading`); `None` leaves rewards untouched.

    Attributes:
        zero_reward_on_limit: clamp limit-stopped totals to `min(total, 0.0)`.
        limit_stop_reasons: the stop reasons that count as limit stops.
        skip_grading_on_timeout: skip the grading call (rewards 0.0) when every trajectory of
            the group stopped on `rollout_timeout`, the clamp is on and `rollout_timeout` is a
            limit stop.
        grader_timeout_seconds: wall clock of one grading call; exceeding it raises
            `TimeoutError`.
        pass_all_messages_to_grader: what an env-level grader sees (full history or only the
            messages generated during the rollout).
    """

    zero_reward_on_limit: bool = chz.field(
        default=False,
        validator=_bool,
        doc="Clamp the total reward of a trajectory stopped by a limit in limit_stop_reasons "
        "to min(reward, 0.0) after grading; negative rewards pass unchanged.",
    )
    limit_stop_reasons: tuple[str, ...] = chz.field(
        default=DEFAULT_LIMIT_STOP_REASONS,
        validator=_stop_reasons,
        doc="Stop reasons treated as limit stops for zero_reward_on_limit (default: "
        "max_tokens, max_sampled_tokens, max_turns, max_tool_calls, rollout_timeout).",
    )
    skip_grading_on_timeout: bool = chz.field(
        default=False,
        validator=_bool,
        doc="Skip the grader call and use 0.0 when every trajectory of the group stopped with "
        "rollout_timeout, zero_reward_on_limit is True and rollout_timeout is a limit stop.",
    )
    grader_timeout_seconds: float | None = chz.field(
        default=None,
        validator=_positive_seconds_or_none,
        doc="Wall-clock budget of a grading call (compute_group_rewards, or an env's "
        "reward_fn); a timeout raises TimeoutError. None: unbounded.",
    )
    pass_all_messages_to_grader: bool = chz.field(
        default=False,
        validator=_bool,
        doc="Env-level graders see the full history (True) or only the messages generated "
        "during the rollout (False). Group-level graders always get whole trajectories.",
    )


def should_skip_group_grading(
    termination: TerminationRewardPolicy | None, trajectories: Sequence[Trajectory]
) -> bool:
    """Whether `compute_group_rewards` can be skipped for this group (all rewards become 0.0).

    True when `termination` asks for it (`skip_grading_on_timeout` and `zero_reward_on_limit`,
    with `rollout_timeout` among `limit_stop_reasons`) and every trajectory stopped on
    `rollout_timeout`; one member that needs a grade keeps the whole group call.
    """
    if termination is None:
        return False
    return limits_lib.skip_group_grading(
        [traj.stop_reason for traj in trajectories],
        skip_grading_on_timeout=termination.skip_grading_on_timeout,
        zero_reward_on_limit=termination.zero_reward_on_limit,
        limit_stop_reasons=termination.limit_stop_reasons,
    )


def apply_zero_reward_on_limit(
    termination: TerminationRewardPolicy,
    trajectories: Sequence[Trajectory],
    rewards_G: Sequence[float],
    metrics_G: Sequence[Metrics],
) -> tuple[list[float], list[Metrics]]:
    """Grade-then-clamp: the group rewards and metrics after `termination`'s clamp.

    A trajectory stopped by a limit whose total (`sum of step rewards + group reward`) is
    positive gets the group reward `-sum of step rewards` (total exactly 0.0) and the metric
    `zero_reward_on_limit = 1.0`; every other member is unchanged. Nothing changes unless
    `termination.zero_reward_on_limit`.

    Args:
        termination: the policy.
        trajectories: the group's trajectories (their `stop_reason` decides).
        rewards_G: the graded group-level reward of each trajectory.
        metrics_G: the graded group-level metrics of each trajectory.

    Returns:
        New lists `(rewards_G, metrics_G)`; the inputs are not modified.
    """
    rewards = list(rewards_G)
    metrics = [dict(m) for m in metrics_G]
    if not termination.zero_reward_on_limit:
        return rewards, metrics
    if len(metrics) != len(rewards):
        raise ValueError(
            f"apply_zero_reward_on_limit: rewards_G has {len(rewards)} items, metrics_G "
            f"{len(metrics)}; they must be equal"
        )
    clamped = limits_lib.zero_reward_on_limit(
        [[t.reward for t in traj.transitions] for traj in trajectories],
        rewards,
        [traj.stop_reason for traj in trajectories],
        limit_stop_reasons=termination.limit_stop_reasons,
    )
    for g, was_clamped in enumerate(clamped.clamped_G):
        if was_clamped:
            rewards[g] = clamped.final_rewards_G[g]
            metrics[g] = {**metrics[g], ZERO_REWARD_ON_LIMIT_METRIC_KEY: 1.0}
    return rewards, metrics
