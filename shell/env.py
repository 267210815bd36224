"""Environment API: `Env`, `EnvGroupBuilder`, `RLDataset`, `RLDatasetBuilder`, `ProblemEnv`.

Conventions (signatures follow tinker-cookbook's `rl/types.py`, records come from `rlpure`):
- Observations are `rlpure.records.ModelInput` (int32 token arrays); actions are int32 token
  arrays (`TokensWithLogprobs.tokens`, read-only); `Env.step` returns
  `rlpure.records.StepResult`. Conversion to and from `tinker.ModelInput` happens only in the
  completer (`shell.completers`), at the SDK edge.
- An `Env` is single-use: one episode, then discarded. An `EnvGroupBuilder` makes the `G` envs
  of one group (GRPO centres rewards within it) and may be asked for more envs when a rollout is
  retried; `cleanup()` is called exactly once per group by the rollout code.
- `compute_group_rewards` returns one `(reward, metrics)` pair per trajectory; the reward is
  *added* to the trajectory's step rewards (`TrajectoryGroup.final_rewards_G`).
- Outside failures inside an env should raise `shell.errors.EnvFailure` (or another type listed
  in the rollout strategy's `failures`) so tolerant strategies retry them; anything else is
  treated as a bug and propagates.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np

from rlpure.records import Metrics, ModelInput, StepResult, StopCondition, Trajectory
from rlpure.render import Renderer

__all__ = [
    "Action",
    "ActionExtra",
    "Env",
    "EnvGroupBuilder",
    "ProblemEnv",
    "ProblemGroupBuilder",
    "RLDataset",
    "RLDatasetBuilder",
]

Action = np.ndarray | Sequence[int]
"""An action: int32 token ids `[T]` (the rollout passes the read-only sampled array)."""


class ActionExtra(TypedDict, total=False):
    """Metadata passed with an action to `Env.step` (all keys optional)."""

    stop_reason: str
    """Why sampling stopped: `"stop"` (stop sequence or EOS) or `"length"` (max_tokens)."""


class Env(ABC):
    """A single-use environment that one agent interacts with for one episode."""

    @abstractmethod
    async def initial_observation(self) -> tuple[ModelInput, StopCondition]:
        """Returns the first observation and the stop condition for the first sample."""

    @abstractmethod
    async def step(self, action: Action, *, extra: ActionExtra | None = None) -> StepResult:
        """Advances the episode by one action.

        Args:
            action: int32 token ids `[T]` the policy sampled.
            extra: metadata about the action (e.g. its `stop_reason`).

        Returns:
            The step's reward, whether the episode ended, and the next observation.
        """


class EnvGroupBuilder(ABC):
    """Builds the envs of one group and scores the group as a whole."""

    @abstractmethod
    async def make_envs(self) -> Sequence[Env]:
        """Creates the group's envs (called again for fresh envs when a rollout is retried)."""

    async def compute_group_rewards(
        self, trajectories: Sequence[Trajectory], envs: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        """Group-level reward and metrics of each trajectory; defaults to `(0.0, {})` each.

        Args:
            trajectories: the group's completed trajectories, in slot order.
            envs: the envs that produced them, same order.

        Returns:
            One `(reward, metrics)` per trajectory; the reward is added to its step rewards.
        """
        return [(0.0, {}) for _ in trajectories]

    async def cleanup(self) -> None:
        """Releases what `make_envs` acquired; called exactly once per group, in every path."""
        return None

    def logging_tags(self) -> list[str]:
        """Tags used to aggregate metrics by environment type (e.g. `["gsm8k"]`)."""
        return []


class RLDataset(ABC):
    """A sequence of batches; batch `i` is a list of `EnvGroupBuilder`s (one per problem)."""

    @abstractmethod
    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        """The group builders of batch `index` (`0 <= index < len(self)`)."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of batches."""


class RLDatasetBuilder(ABC):
    """Builds the training dataset and an optional test dataset."""

    @abstractmethod
    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        """Returns `(train_dataset, test_dataset_or_None)`."""


class ProblemEnv(Env):
    """A single-turn question/answer env rewarding correct answers and well-formed responses.

    Reward: `format_coef * (format - 1) + correct`, with `format`, `correct` in {0, 1}; so a
    correct, well-formed answer scores 1, a malformed one loses `format_coef`. By default a
    response is well-formed only if it ended on the renderer's stop sequence (not EOS or a
    truncation) *and* `check_format` accepts it (the cookbook's strict R1-Zero behaviour).
    Metrics: `format`, `correct`.

    Subclasses implement `get_question`, `check_answer`, `check_format`,
    `get_reference_answer`. The renderer (e.g. `rlpure.render.get_renderer("role_colon", tok)`)
    builds the prompt `[BOS]User: {q}\n\nAssistant:` and parses the response.
    """

    def __init__(
        self,
        renderer: Renderer,
        *,
        convo_prefix: Sequence[Mapping[str, str]] | None = None,
        format_coef: float = 0.1,
        require_stop_sequence_for_format: bool = True,
    ) -> None:
        if not math.isfinite(format_coef) or format_coef < 0:
            raise ValueError(
                f"ProblemEnv.format_coef: expected a finite value >= 0, got {format_coef}"
            )
        self.renderer = renderer
        self.convo_prefix: list[Mapping[str, str]] = list(convo_prefix or [])
        self.format_coef = format_coef
        self.require_stop_sequence_for_format = require_stop_sequence_for_format

    @property
    def stop_condition(self) -> StopCondition:
        return tuple(self.renderer.get_stop_sequences())

    @abstractmethod
    def get_question(self) -> str:
        """The question text."""

    @abstractmethod
    def check_answer(self, sample_str: str) -> bool:
        """Whether the decoded response answers correctly."""

    @abstractmethod
    def check_format(self, sample_str: str) -> bool:
        """Whether the decoded response follows the expected format."""

    @abstractmethod
    def get_reference_answer(self) -> str:
        """The reference answer, for logs."""

    def _conversation(self) -> list[Mapping[str, str]]:
        return [*self.convo_prefix, {"role": "user", "content": self.get_question()}]

    async def initial_observation(self) -> tuple[ModelInput, StopCondition]:
        return self.renderer.build_generation_prompt(self._conversation()), self.stop_condition

    async def step(self, action: Action, *, extra: ActionExtra | None = None) -> StepResult:
        parsed = self.renderer.parse_response(action)
        content = parsed.content
        if self.require_stop_sequence_for_format:
            well_formed = parsed.is_stop_sequence
        else:
            well_formed = parsed.is_clean
        format_ok = float(well_formed and self.check_format(content))
        correct = float(self.check_answer(content))
        return StepResult(
            reward=self.format_coef * (format_ok - 1.0) + correct,
            episode_done=True,
            next_observation=ModelInput.empty(),
            next_stop_condition=self.stop_condition,
            metrics={"format": format_ok, "correct": correct},
            logs={
                "question": self.get_question(),
                "response": content,
                "reference_answer": self.get_reference_answer(),
            },
        )


@dataclass(frozen=True)
class ProblemGroupBuilder(EnvGroupBuilder):
    """A group of `num_envs` `ProblemEnv`s on the **same** problem (`env_thunk` builds one).

    Attributes:
        env_thunk: builds one env for the problem; called once per env (and per retry).
        num_envs: group size `G` (>= 1).
        dataset_name: the logging tag.
    """

    env_thunk: Callable[[], ProblemEnv]
    num_envs: int
    dataset_name: str = "problems"
    tags: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.num_envs < 1:
            raise ValueError(f"ProblemGroupBuilder.num_envs: expected >= 1, got {self.num_envs}")

    async def make_envs(self) -> Sequence[Env]:
        return [self.env_thunk() for _ in range(self.num_envs)]

    def logging_tags(self) -> list[str]:
        return [self.dataset_name, *self.tags]
