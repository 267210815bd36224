"""Environment API: `Env`, `EnvGroupBuilder`, `RLDataset`, `RLDatasetBuilder`, `ProblemEnv`.

The names and signatures of tinker-cookbook 0.6.1's `rl/types.py` and `rl/problem_env.py`
(`shell.cookbook.rl.types` / `shell.cookbook.rl.problem_env` re-export them); the records come from
`rlpure.records`.

Conventions:
- Observations (`Observation`) are `rlpure.records.ModelInput` (int32 token arrays). Records
  built by env code also accept a `tinker.ModelInput` or a list of token ids and convert it at
  construction, so cookbook env code that returns `tinker.ModelInput.from_ints(...)` works.
- Actions reach `Env.step` as `list[int]` (`Action`), as in the cookbook: the rollout runner
  passes the sampled tokens as a plain list. Envs here also accept an int32 array.
- `initial_observation` returns `(observation, stop_condition)`, or an
  `InitialObservationOverflow` when the prompt alone already exceeds the env's token budget
  (the rollout then ends at once with that record's reward, metrics and logs).
- An `Env` is single-use: one episode, then discarded. An `EnvGroupBuilder` makes the `G` envs
  of one group (GRPO centres rewards within it) and may be asked for more envs when a rollout is
  retried; `cleanup()` is called exactly once per group by the rollout code.
- `compute_group_rewards(trajectory_group, env_group)` returns one `(reward, metrics)` pair per
  trajectory; the reward is *added* to the trajectory's step rewards
  (`TrajectoryGroup.final_rewards_G`).
- `RLDatasetBuilder` is a plain abstract class (the cookbook's is a `chz` class); cookbook
  builders that subclass it under `@chz.chz` work unchanged.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypedDict

import numpy as np

from rlpure.records import (
    PARSE_ERROR_MASKED_METRIC_KEY,
    STOP_METRIC_PREFIX,
    InitialObservationOverflow,
    Logs,
    Metrics,
    ModelInput,
    RolloutError,
    StepResult,
    StopCondition,
    StopReason,
    Trajectory,
    as_model_input,
)
from rlpure.render import Renderer

__all__ = [
    "PARSE_ERROR_MASKED_METRIC_KEY",
    "STOP_METRIC_PREFIX",
    "Action",
    "ActionExtra",
    "Env",
    "EnvGroupBuilder",
    "InitialObservationOverflow",
    "Logprobs",
    "Logs",
    "Metrics",
    "Observation",
    "ProblemEnv",
    "ProblemGroupBuilder",
    "RLDataset",
    "RLDatasetBuilder",
    "RolloutError",
    "StopCondition",
    "StopReason",
]

Action: TypeAlias = list[int]
"""An action: the sampled token ids, passed to `Env.step` as a plain `list[int]`."""

Observation: TypeAlias = ModelInput
"""What the policy sees: token ids (records also accept a `tinker.ModelInput` and convert it)."""

Logprobs: TypeAlias = list[float]
"""Per-token sampling log-probabilities."""


class ActionExtra(TypedDict, total=False):
    """Metadata passed with an action to `Env.step` (all keys optional)."""

    stop_reason: str
    """Why sampling stopped: `"stop"` (stop sequence or EOS) or `"length"` (max_tokens)."""


class Env(ABC):
    """A single-use environment that one agent interacts with for one episode."""

    @abstractmethod
    async def initial_observation(
        self,
    ) -> tuple[Observation, StopCondition] | InitialObservationOverflow:
        """The first observation and the stop condition for the first sample.

        Returns:
            `(observation, stop_condition)`, or an `InitialObservationOverflow` when the
            initial prompt already exceeds the env's token budget (no sampling call is made).
        """

    @abstractmethod
    async def step(self, action: Action, *, extra: ActionExtra | None = None) -> StepResult:
        """Advances the episode by one action.

        Args:
            action: the token ids the policy sampled (`list[int]`).
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
        self, trajectory_group: list[Trajectory], env_group: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        """Group-level reward and metrics of each trajectory; defaults to `(0.0, {})` each.

        Args:
            trajectory_group: the group's completed trajectories, in slot order.
            env_group: the envs that produced them, same order.

        Returns:
            One `(reward, metrics)` per trajectory; the reward is added to its step rewards.
        """
        return [(0.0, {}) for _ in trajectory_group]

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
    truncation) *and* `check_format` accepts it (the cookbook's strict R1-Zero behaviour);
    with `require_stop_sequence_for_format=False` a clean EOS counts too.
    Metrics: `format`, `correct`. Logs: none, as the cookbook's (which writes its diagnostics
    to `logtree`); `log_responses=True` records `question`, `response` and `reference_answer`.

    Subclasses implement `get_question`, `check_answer`, `check_format`,
    `get_reference_answer`. Two kinds of renderer work:
    - rlpure's (`rlpure.render.get_renderer("role_colon", tok)`), whose `parse_response`
      returns a `ParsedResponse` (`.content`, `.is_stop_sequence`, `.is_clean`);
    - the cookbook's API (`shell.chat` or `tinker_cookbook.renderers`), whose
      `parse_response` returns `(message, termination)`; the text is the message's string
      content, or the concatenated `text` parts of a list content (`get_text_content`).
    The observation is stored as an rlpure `ModelInput` whichever renderer built it.

    Args:
        renderer: builds the prompt and parses the response.
        convo_prefix: messages before the question (e.g. few-shot examples).
        format_coef: penalty for a malformed response (finite, >= 0).
        require_stop_sequence_for_format: only a stop-sequence ending is well-formed.
        log_responses: also return the question, response and reference answer as logs
            (rlpure's extra; keyword-only).
    """

    def __init__(
        self,
        renderer: Renderer | Any,
        convo_prefix: Sequence[Mapping[str, Any]] | None = None,
        format_coef: float = 0.1,
        require_stop_sequence_for_format: bool = True,
        *,
        log_responses: bool = False,
    ) -> None:
        if not math.isfinite(format_coef) or format_coef < 0:
            raise ValueError(
                f"ProblemEnv.format_coef: expected a finite value >= 0, got {format_coef}"
            )
        self.renderer = renderer
        self.convo_prefix: list[Mapping[str, Any]] = list(convo_prefix or [])
        self.format_coef = format_coef
        self.require_stop_sequence_for_format = require_stop_sequence_for_format
        self.log_responses = log_responses

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

    def _conversation(self) -> list[Mapping[str, Any]]:
        return [*self.convo_prefix, {"role": "user", "content": self.get_question()}]

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        prompt = self.renderer.build_generation_prompt(self._conversation())
        observation = as_model_input(prompt, record="ProblemEnv", field="initial_observation")
        return observation, self.stop_condition

    async def step(self, action: Action, *, extra: ActionExtra | None = None) -> StepResult:
        tokens = action.tolist() if isinstance(action, np.ndarray) else list(action)
        content, is_stop_sequence, is_clean = _parse_response(self.renderer, tokens)
        well_formed = is_stop_sequence if self.require_stop_sequence_for_format else is_clean
        format_ok = float(well_formed) and float(self.check_format(content))
        correct = float(self.check_answer(content))
        logs: Logs = {}
        if self.log_responses:
            logs = {
                "question": self.get_question(),
                "response": content,
                "reference_answer": self.get_reference_answer(),
            }
        return StepResult(
            reward=self.format_coef * (format_ok - 1) + correct,
            episode_done=True,
            next_observation=ModelInput.empty(),
            next_stop_condition=self.stop_condition,
            metrics={"format": format_ok, "correct": correct},
            logs=logs,
        )


def _parse_response(renderer: Any, tokens: list[int]) -> tuple[str, bool, bool]:
    """`(text, is_stop_sequence, is_clean)` of a response, from either kind of renderer."""
    parsed = renderer.parse_response(tokens)
    if isinstance(parsed, tuple) and len(parsed) == 2:  # the cookbook's (message, termination)
        message, termination = parsed
        return (
            _text_content(message),
            bool(termination.is_stop_sequence),
            bool(termination.is_clean),
        )
    return parsed.content, bool(parsed.is_stop_sequence), bool(parsed.is_clean)


def _text_content(message: Mapping[str, Any]) -> str:
    """A message's text: a string content as is, else its `text` parts joined (no thinking).

    The cookbook's `renderers.get_text_content`, kept here so `shell.env` does not import the
    renderer package (which imports the env API).
    """
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(part["text"] for part in content if part["type"] == "text")


@dataclass(frozen=True)
class ProblemGroupBuilder(EnvGroupBuilder):
    """A group of `num_envs` `ProblemEnv`s on the **same** problem (`env_thunk` builds one).

    Attributes:
        env_thunk: builds one env for the problem; called once per env (and per retry).
        num_envs: group size `G` (>= 1).
        dataset_name: the first logging tag.
        tags: further logging tags (rlpure's extra; keyword-only).
    """

    env_thunk: Callable[[], ProblemEnv]
    num_envs: int
    dataset_name: str = "problems"
    tags: tuple[str, ...] = field(default=(), kw_only=True)

    def __post_init__(self) -> None:
        if self.num_envs < 1:
            raise ValueError(f"ProblemGroupBuilder.num_envs: expected >= 1, got {self.num_envs}")

    async def make_envs(self) -> Sequence[Env]:
        return [self.env_thunk() for _ in range(self.num_envs)]

    async def compute_group_rewards(
        self, trajectory_group: list[Trajectory], env_group: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        """Zero group rewards: all the reward comes from the per-step scoring."""
        return [(0.0, {}) for _ in range(len(trajectory_group))]

    def logging_tags(self) -> list[str]:
        return [self.dataset_name, *self.tags]
