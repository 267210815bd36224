"""The episode records: transitions, trajectories, groups, step results, and why episodes end.

Conventions:
- Field names follow tinker-cookbook's `rl/types.py`; sequence fields (`Trajectory.transitions`,
  `TrajectoryGroup.trajectories_G`, ...) are tuples; `_G` fields have one item per trajectory.
- `__post_init__` converts and validates every field (msgspec runs it when decoding too).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec
import numpy as np
from msgspec.structs import force_setattr
from numpy.typing import ArrayLike

from rlpure.records._cookbook_inputs import (
    ModelInputLike,
    TokensWithLogprobsLike,
    _dataclass_compatible,
    as_model_input,
    as_tokens_with_logprobs,
)
from rlpure.records._fields import (
    Logs,
    Metrics,
    StopCondition,
    _check_bool,
    _check_str,
    _finite_float,
    _is_token_id,
    _plain_logs,
    _plain_metrics,
    _tuple_of,
    as_stop_condition,
)
from rlpure.records._tokens import ModelInput, TokensWithLogprobs

PARSE_ERROR_MASKED_METRIC_KEY = "parse_error_masked"
"""Transition metric that, when >= 1, excludes the transition's action tokens from training."""

STOP_METRIC_PREFIX = "stop/"
"""Metric-key prefix of the one-hot stop-reason metrics (`stop/<reason>`), as the cookbook's."""


class StopReason(enum.StrEnum):
    """Why a trajectory ended (the cookbook's `rl.types.StopReason`, same values).

    An env that knows why its episode ended records `metrics["stop/<reason>"] = 1.0` on the
    final transition; the rollout mirrors it onto `Trajectory.stop_reason`.
    """

    COMPLETED = "completed"
    """The agent finished on its own (e.g. answered without tool calls)."""
    TOOL_STOPPED = "tool_stopped"
    """A tool signalled that the episode should stop."""
    MAX_TURNS = "max_turns"
    """The turn cap was reached."""
    MAX_TOKENS = "max_tokens"
    """The token budget ran out (mid-turn truncation, between turns, or an oversized prompt)."""
    MAX_SAMPLED_TOKENS = "max_sampled_tokens"
    """The cumulative sampled-token (action-only) budget ran out."""
    MAX_TOOL_CALLS = "max_tool_calls"
    """The trajectory's tool-call budget ran out."""
    CONTEXT_OVERFLOW = "context_overflow"
    """The rendered conversation exceeded the trajectory token budget."""
    PARSE_ERROR = "parse_error"
    """The model output (or its tool calls) failed to parse."""
    ROLLOUT_TIMEOUT = "rollout_timeout"
    """The rollout exceeded its wall-clock budget."""


class InitialObservationOverflow(msgspec.Struct, frozen=True, kw_only=True):
    """Returned by `Env.initial_observation` instead of a pair when the prompt is already too long.

    The cookbook's sentinel: the rollout ends at once, gracefully (no sampling call), with one
    synthetic transition (empty observation and action, `episode_done=True`) carrying
    `reward`, `metrics` and `logs`; `Trajectory.stop_reason` is mirrored from the
    `stop/<reason>` metric (`StopReason.MAX_TOKENS` for a prompt overflow). Returning it rather
    than raising keeps one oversized prompt from failing its whole group under `FailFast`.

    Attributes:
        reward: reward of the synthetic final transition (finite).
        metrics: its metrics; should hold a one-hot `stop/<reason>` key.
        logs: diagnostics (e.g. the overflow's description).
    """

    reward: float
    metrics: Metrics = msgspec.field(default_factory=dict)
    logs: Logs = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        record = "InitialObservationOverflow"
        force_setattr(self, "reward", _finite_float(self.reward, record, "reward"))
        force_setattr(self, "metrics", _plain_metrics(self.metrics, record, "metrics"))
        force_setattr(self, "logs", _plain_logs(self.logs, record, "logs"))


class Transition(msgspec.Struct, frozen=True, kw_only=True):
    """One observation → action → reward step of an episode.

    Attributes:
        ob: what the policy saw before acting.
        ac: what it sampled.
        reward: immediate reward for this step (finite).
        episode_done: whether this step ended the episode.
        metrics: numbers averaged into the training logs (e.g. `format`, `correct`,
            `parse_error_masked`).
        logs: free-form diagnostics, not aggregated.
    """

    ob: ModelInput
    ac: TokensWithLogprobs
    reward: float
    episode_done: bool
    metrics: Metrics = msgspec.field(default_factory=dict)
    logs: Logs = msgspec.field(default_factory=dict)

    if TYPE_CHECKING:

        def __init__(
            self,
            *,
            ob: ModelInputLike,
            ac: TokensWithLogprobsLike,
            reward: float,
            episode_done: bool,
            metrics: Mapping[str, float | int | bool] = ...,
            logs: Mapping[str, str | int | float | bool] = ...,
        ) -> None: ...

    def __post_init__(self) -> None:
        force_setattr(self, "ob", as_model_input(self.ob, record="Transition", field="ob"))
        force_setattr(self, "ac", as_tokens_with_logprobs(self.ac, record="Transition", field="ac"))
        force_setattr(self, "reward", _finite_float(self.reward, "Transition", "reward"))
        force_setattr(
            self, "episode_done", _check_bool(self.episode_done, "Transition", "episode_done")
        )
        force_setattr(self, "metrics", _plain_metrics(self.metrics, "Transition", "metrics"))
        force_setattr(self, "logs", _plain_logs(self.logs, "Transition", "logs"))


class Trajectory(msgspec.Struct, frozen=True, kw_only=True):
    """A whole episode: its transitions, the observation after the last one, and why it ended."""

    transitions: tuple[Transition, ...]
    final_ob: ModelInput = msgspec.field(default_factory=ModelInput.empty)
    stop_reason: str | None = None

    if TYPE_CHECKING:

        def __init__(
            self,
            *,
            transitions: Sequence[Transition],
            final_ob: ModelInputLike = ...,
            stop_reason: str | None = None,
        ) -> None: ...

    def __post_init__(self) -> None:
        force_setattr(
            self,
            "transitions",
            _tuple_of(self.transitions, Transition, "Trajectory", "transitions"),
        )
        force_setattr(
            self, "final_ob", as_model_input(self.final_ob, record="Trajectory", field="final_ob")
        )
        _check_str(self.stop_reason, "Trajectory", "stop_reason", optional=True)
        if self.stop_reason is not None:  # a `StopReason` member is stored as its plain value
            force_setattr(self, "stop_reason", str(self.stop_reason))

    def total_step_reward(self) -> float:
        """Sum of the per-step rewards, left to right in float64 (as the cookbook sums)."""
        transitions = self.transitions
        if len(transitions) == 1:  # the common case; `sum` starts from int 0 too (-0.0 -> 0.0)
            return 0 + transitions[0].reward
        return sum(t.reward for t in transitions)


class RolloutError(msgspec.Struct, frozen=True, kw_only=True):
    """A rollout failure captured as data (exception class name and message)."""

    error_type: str
    error_message: str

    def __post_init__(self) -> None:
        _check_str(self.error_type, "RolloutError", "error_type")
        _check_str(self.error_message, "RolloutError", "error_message")


class TrajectoryGroup(msgspec.Struct, frozen=True, kw_only=True):
    """The trajectories of one group (same problem), with group-level rewards and metrics.

    Attributes:
        trajectories_G: one trajectory per env of the group.
        final_rewards_G: group-level reward of each trajectory (from `compute_group_rewards`).
        metrics_G: group-level metrics of each trajectory.
        rollout_errors: failures captured under tolerant rollout strategies.
    """

    trajectories_G: tuple[Trajectory, ...]
    final_rewards_G: tuple[float, ...]
    metrics_G: tuple[Metrics, ...]
    rollout_errors: tuple[RolloutError, ...] = ()

    if TYPE_CHECKING:

        def __init__(
            self,
            *,
            trajectories_G: Sequence[Trajectory],
            final_rewards_G: Sequence[float] | ArrayLike,
            metrics_G: Sequence[Mapping[str, float | int]],
            rollout_errors: Sequence[RolloutError] = (),
        ) -> None: ...

    def __post_init__(self) -> None:
        trajs = _tuple_of(self.trajectories_G, Trajectory, "TrajectoryGroup", "trajectories_G")
        if hasattr(self.final_rewards_G, "__array__") and not isinstance(
            self.final_rewards_G, Sequence
        ):
            final_rewards = np.asarray(self.final_rewards_G).tolist()  # numpy / jax arrays
        else:
            final_rewards = self.final_rewards_G
        rewards = tuple(
            _finite_float(r, "TrajectoryGroup", f"final_rewards_G[{i}]")
            for i, r in enumerate(
                _tuple_of(final_rewards, object, "TrajectoryGroup", "final_rewards_G")
            )
        )
        metrics = tuple(
            _plain_metrics(m, "TrajectoryGroup", f"metrics_G[{i}]")
            for i, m in enumerate(
                _tuple_of(self.metrics_G, Mapping, "TrajectoryGroup", "metrics_G")
            )
        )
        if not len(trajs) == len(rewards) == len(metrics):
            raise ValueError(
                f"TrajectoryGroup: trajectories_G has {len(trajs)} items, final_rewards_G "
                f"{len(rewards)}, metrics_G {len(metrics)}; they must be equal"
            )
        errors = _tuple_of(self.rollout_errors, RolloutError, "TrajectoryGroup", "rollout_errors")
        force_setattr(self, "trajectories_G", trajs)
        force_setattr(self, "final_rewards_G", rewards)
        force_setattr(self, "metrics_G", metrics)
        force_setattr(self, "rollout_errors", errors)

    def get_total_rewards(self) -> list[float]:
        """Sum of step rewards plus the final group reward, per trajectory (cookbook semantics)."""
        return [
            traj.total_step_reward() + final
            for traj, final in zip(self.trajectories_G, self.final_rewards_G, strict=True)
        ]


class StepResult(msgspec.Struct, frozen=True, kw_only=True):
    """What `Env.step` returns."""

    reward: float
    episode_done: bool
    next_observation: ModelInput
    next_stop_condition: StopCondition = ()
    metrics: Metrics = msgspec.field(default_factory=dict)
    logs: Logs = msgspec.field(default_factory=dict)

    if TYPE_CHECKING:

        def __init__(
            self,
            *,
            reward: float,
            episode_done: bool,
            next_observation: ModelInputLike,
            next_stop_condition: Sequence[str | int] = (),
            metrics: Mapping[str, float | int | bool] = ...,
            logs: Mapping[str, str | int | float | bool] = ...,
        ) -> None: ...

    def __post_init__(self) -> None:
        force_setattr(self, "reward", _finite_float(self.reward, "StepResult", "reward"))
        force_setattr(
            self, "episode_done", _check_bool(self.episode_done, "StepResult", "episode_done")
        )
        force_setattr(
            self,
            "next_observation",
            as_model_input(self.next_observation, record="StepResult", field="next_observation"),
        )
        if isinstance(self.next_stop_condition, bytes) or not isinstance(
            self.next_stop_condition, (str, Sequence, np.ndarray)
        ):
            raise TypeError(
                "StepResult.next_stop_condition: expected a stop string, or a list or tuple of "
                f"stop strings or token ids, got {type(self.next_stop_condition).__name__}"
            )
        # a str is one stop string, as `tinker.SamplingParams.stop` takes it
        stop = as_stop_condition(self.next_stop_condition)
        if not (all(isinstance(s, str) for s in stop) or all(_is_token_id(s) for s in stop)):
            raise TypeError(
                "StepResult.next_stop_condition: expected all strings or all non-negative "
                f"token ids, got {stop!r}"
            )
        force_setattr(
            self,
            "next_stop_condition",
            tuple(int(s) if not isinstance(s, str) else s for s in stop),
        )
        force_setattr(self, "metrics", _plain_metrics(self.metrics, "StepResult", "metrics"))
        force_setattr(self, "logs", _plain_logs(self.logs, "StepResult", "logs"))


# `dataclasses.replace`, `fields` and `asdict` work on these as on the cookbook's `@dataclass`
# records.
for _cookbook_dataclass in (
    InitialObservationOverflow,
    StepResult,
    Transition,
    Trajectory,
    RolloutError,
    TrajectoryGroup,
    TokensWithLogprobs,
):
    _dataclass_compatible(_cookbook_dataclass)
