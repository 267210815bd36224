"""The cookbook's `tinker_cookbook.rl.message_env`: message-level envs and their token-level adapter.

A `MessageEnv` talks in renderer messages (`list[Message]` in, one assistant `Message` per
step); `EnvFromMessageEnv` wraps one as a token-level `shell.cookbook.rl.types.Env` by rendering the
conversation with a renderer and parsing each sampled action back into a message. Names,
constructor arguments, defaults, rewards, metrics and stop reasons are the cookbook 0.6.1
module's:

- Context safety: with `max_trajectory_tokens` set, an observation whose length plus
  `max_generation_tokens` exceeds it ends the episode with `context_overflow_reward` instead of
  a sampling call the backend would refuse — before the first turn as an
  `InitialObservationOverflow` (`stop/max_tokens`), after a step as a final `StepResult`
  (`context_overflow`, `stop/context_overflow`). An episode that ends on its own keeps its
  real reward (no next sampling call, so no overflow).
- Truncation is not a parse error: an action sampled with `extra["stop_reason"] == "length"`
  ends the episode with `context_overflow_reward` and `stop/max_tokens` (`max_tokens_reached`),
  or, with `terminate_on_length=False` and an inner env that records truncated turns
  (`observe_truncated_response`), is kept and the episode continues.
- Parse failures: a structural failure (`not termination.is_clean`: the stop signal never came)
  gives `failed_parse_reward`, `parse_error` and, when it terminates, `stop/parse_error`; with a
  `ParseErrorPolicy` the episode always ends with the policy's `terminal_reward` (and
  `PARSE_ERROR_MASKED_METRIC_KEY` when it masks error turns). Content failures (malformed tool
  calls) are the inner env's business (`shell.agents.AgentToolMessageEnv`).
- Seams the rollout runner (`shell.rollouts.run_rollout`) pushes configuration through:
  `set_parse_error_policy`, `set_max_tool_calls`, `inject_messages`; `rollout_limits` is read by
  the runner when it has no limits of its own.

Differences from the cookbook, on purpose: `MessageStepResult` is a `msgspec.Struct` (positional
and keyword construction as the cookbook's dataclass); rendering runs in a worker thread as the
cookbook's does.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod

import msgspec
import tinker

from rlpure.records import (
    PARSE_ERROR_MASKED_METRIC_KEY,
    STOP_METRIC_PREFIX,
    InitialObservationOverflow,
    Logs,
    Metrics,
    StepResult,
    StopReason,
    as_model_input,
)
from shell.chat._base import Message, ParseTermination, Renderer, classify_parse_failure
from shell.completion import StopCondition
from shell.env import Action, ActionExtra, Env, Observation
from shell.rollouts import ParseErrorPolicy, RolloutLimits

__all__ = ["EnvFromMessageEnv", "MessageEnv", "MessageStepResult", "logger"]

logger = logging.getLogger(__name__)
"""This module's logger (the cookbook's module has one of the same name)."""


class MessageStepResult(msgspec.Struct):
    """What `MessageEnv.step` returns.

    Attributes:
        reward: the step's reward.
        episode_done: whether the episode ended.
        next_messages: the whole conversation so far (the next prompt renders it).
        metrics: the step's metrics.
        logs: the step's diagnostics.
        next_stop_condition: stop condition for the next sample; None keeps the renderer's.
    """

    reward: float
    episode_done: bool
    next_messages: list[Message]
    metrics: dict[str, float] = msgspec.field(default_factory=dict)
    logs: Logs = msgspec.field(default_factory=dict)
    next_stop_condition: StopCondition | None = None


class MessageEnv(ABC):
    """A message-level environment: a conversation the policy takes assistant turns in."""

    @abstractmethod
    async def initial_observation(self) -> list[Message]:
        """The conversation before the first assistant turn."""

    @abstractmethod
    async def step(self, message: Message) -> MessageStepResult:
        """Takes one parsed assistant message; returns the reward and the conversation so far."""

    async def observe_truncated_response(self, message: Message) -> list[Message] | None:
        """Records an assistant turn cut off by the per-turn `max_tokens` without stepping.

        Returns:
            The conversation with the truncated turn appended, or None (the default) when the
            env cannot record one; the adapter then ends the episode as on any truncation.
        """
        return None

    async def add_messages(self, messages: list[Message]) -> list[Message] | None:
        """Appends messages injected from outside (rollout hooks) to the conversation.

        Returns:
            The updated conversation, or None (the default) when the env takes no injections.
        """
        return None


def _stop_metrics(reason: StopReason, extra: Metrics) -> Metrics:
    """`extra` (any names: the inner env's metrics) with the stop reason's metric set."""
    return {**extra, f"{STOP_METRIC_PREFIX}{reason}": 1.0}


class EnvFromMessageEnv(Env):
    """A token-level `Env` over a `MessageEnv`: renders prompts, parses actions into messages.

    Args:
        renderer: renders conversations into prompts and parses sampled tokens.
        message_env: the message-level env (single use, as every env).
        failed_parse_reward: reward of a turn whose response never reached its stop signal.
        terminate_on_parse_error: whether such a turn ends the episode.
        max_trajectory_tokens: the context budget; None disables the overflow checks.
        max_generation_tokens: tokens reserved for the next sample in the overflow checks.
        context_overflow_reward: reward when the episode ends on overflow or truncation.
        terminate_on_length: whether a `"length"` stop ends the episode (False: keep the
            truncated turn when the inner env supports it).
        parse_error_policy: supersedes the two parse-failure options above when set.
        rollout_limits: budgets a rollout runner enforces when it has none of its own.
    """

    def __init__(
        self,
        renderer: Renderer,
        message_env: MessageEnv,
        failed_parse_reward: float = -1.0,
        terminate_on_parse_error: bool = True,
        max_trajectory_tokens: int | None = None,
        max_generation_tokens: int | None = None,
        context_overflow_reward: float = -0.1,
        terminate_on_length: bool = True,
        parse_error_policy: ParseErrorPolicy | None = None,
        rollout_limits: RolloutLimits | None = None,
    ) -> None:
        self.renderer = renderer
        self.message_env = message_env
        self.failed_parse_reward = failed_parse_reward
        self.terminate_on_parse_error = terminate_on_parse_error
        self.max_trajectory_tokens = max_trajectory_tokens
        self.max_generation_tokens = max_generation_tokens
        self.context_overflow_reward = context_overflow_reward
        self.terminate_on_length = terminate_on_length
        self.parse_error_policy = parse_error_policy
        self.rollout_limits = rollout_limits
        self._base_stop_condition = renderer.get_stop_sequences()
        # stored trajectories of episodes that end before MessageEnv.step still get the id
        self.example_id: str | None = getattr(message_env, "example_id", None)

    async def _render_in_thread(self, messages: list[Message]) -> tinker.ModelInput:
        """Renders the generation prompt in a worker thread (tokenising is CPU-bound)."""
        return await asyncio.to_thread(self.renderer.build_generation_prompt, messages)

    def _exceeds_context_limit(self, observation_length: int) -> bool:
        if self.max_trajectory_tokens is None:
            return False
        return observation_length + (self.max_generation_tokens or 0) > self.max_trajectory_tokens

    def _final(self, reward: float, metrics: Metrics, logs: Logs | None = None) -> StepResult:
        return StepResult(
            reward=reward,
            episode_done=True,
            next_observation=tinker.ModelInput.empty(),
            next_stop_condition=self._base_stop_condition,
            metrics=metrics,
            logs=logs or {},
        )

    async def initial_observation(
        self,
    ) -> tuple[Observation, tuple[str | int, ...]] | InitialObservationOverflow:
        """The rendered first prompt, or an `InitialObservationOverflow` when it is too long.

        The prompt comes back as the project's `ModelInput` (`to_ints()`, `length` as tinker's).
        """
        messages = await self.message_env.initial_observation()
        model_input = await self._render_in_thread(messages)
        if self._exceeds_context_limit(model_input.length):
            reserve = self.max_generation_tokens or 0
            return InitialObservationOverflow(
                reward=self.context_overflow_reward,
                metrics=_stop_metrics(StopReason.MAX_TOKENS, {"max_tokens_reached": 1.0}),
                logs={
                    "initial_observation_overflow": (
                        f"Initial observation ({model_input.length} tokens) + "
                        f"max_generation_tokens ({reserve}) = {model_input.length + reserve} "
                        f"exceeds max_trajectory_tokens ({self.max_trajectory_tokens}). "
                        "This task's prompt is too long for the model's context window."
                    )
                },
            )
        observation = as_model_input(model_input, record="EnvFromMessageEnv", field="observation")
        return observation, tuple(self._base_stop_condition)

    async def step(self, action: Action, *, extra: ActionExtra | None = None) -> StepResult:
        """Parses `action` into a message, steps the inner env, renders the next prompt."""
        if (extra or {}).get("stop_reason", "stop") == "length":
            if not self.terminate_on_length:
                continued = await self._continue_after_truncation(action)
                if continued is not None:
                    return continued
            return self._final(
                self.context_overflow_reward,
                _stop_metrics(StopReason.MAX_TOKENS, {"max_tokens_reached": 1.0}),
            )

        message, termination = self.renderer.parse_response(action)
        if not termination.is_clean:
            if self.parse_error_policy is not None:
                return self._structural_parse_error_step(message, termination)
            metrics: Metrics = {"parse_error": 1.0}
            if self.terminate_on_parse_error:
                metrics = _stop_metrics(StopReason.PARSE_ERROR, metrics)
            return StepResult(
                reward=self.failed_parse_reward,
                episode_done=self.terminate_on_parse_error,
                next_observation=tinker.ModelInput.empty(),
                next_stop_condition=self._base_stop_condition,
                metrics=metrics,
            )

        result = await self.message_env.step(message)
        next_observation = await self._render_in_thread(result.next_messages)
        if not result.episode_done and self._exceeds_context_limit(next_observation.length):
            return self._final(
                self.context_overflow_reward,
                _stop_metrics(
                    StopReason.CONTEXT_OVERFLOW, {**result.metrics, "context_overflow": 1.0}
                ),
                result.logs,
            )
        return StepResult(
            reward=result.reward,
            episode_done=result.episode_done,
            next_observation=next_observation,
            next_stop_condition=result.next_stop_condition or self._base_stop_condition,
            metrics=result.metrics,
            logs=result.logs,
        )

    def _structural_parse_error_step(
        self, message: Message, termination: ParseTermination
    ) -> StepResult:
        """Ends the episode on a structural parse failure under `parse_error_policy`."""
        policy = self.parse_error_policy
        if policy is None:
            raise ValueError("EnvFromMessageEnv: a structural parse-error step needs a policy")
        classified = classify_parse_failure(message, termination)
        kind, detail = classified if classified is not None else ("structural", "")
        metrics = _stop_metrics(StopReason.PARSE_ERROR, {"parse_error": 1.0})
        if policy.mask_error_turns:
            metrics[PARSE_ERROR_MASKED_METRIC_KEY] = 1.0
        return self._final(
            policy.terminal_reward,
            metrics,
            {"parse_failure_kind": str(kind), "parse_failure_detail": detail},
        )

    def set_parse_error_policy(self, policy: ParseErrorPolicy) -> None:
        """Applies a rollout-level parse-error policy here and, when it takes one, inside."""
        self.parse_error_policy = policy
        setter = getattr(self.message_env, "set_parse_error_policy", None)
        if setter is not None:
            setter(policy)
        elif policy.max_consecutive > 0:
            logger.warning(
                "ParseErrorPolicy.max_consecutive=%d is configured, but %s does not support a "
                "parse-error policy; content parse failures will not be retried (structural "
                "handling still applies).",
                policy.max_consecutive,
                type(self.message_env).__name__,
            )

    async def _continue_after_truncation(self, action: Action) -> StepResult | None:
        """Keeps a truncated turn (parsed leniently) and continues; None if the env can't."""
        message, _termination = self.renderer.parse_response(action)
        messages = await self.message_env.observe_truncated_response(message)
        if messages is None:
            return None
        next_observation = await self._render_in_thread(messages)
        if self._exceeds_context_limit(next_observation.length):
            return self._final(
                self.context_overflow_reward,
                _stop_metrics(StopReason.CONTEXT_OVERFLOW, {"context_overflow": 1.0}),
            )
        return StepResult(
            reward=0.0,
            episode_done=False,
            next_observation=next_observation,
            next_stop_condition=self._base_stop_condition,
            logs={"truncated_turn": "sampling stopped on 'length'; turn kept, episode continues"},
        )

    async def inject_messages(
        self, messages: list[Message]
    ) -> tuple[tinker.ModelInput, StopCondition]:
        """Injects messages before the next sample and returns the re-rendered prompt.

        Raises:
            TypeError: the inner env takes no injections (`add_messages` returned None).
        """
        updated = await self.message_env.add_messages(messages)
        if updated is None:
            raise TypeError(
                f"{type(self.message_env).__name__} does not support message injection "
                "(add_messages returned None)"
            )
        return await self._render_in_thread(updated), self._base_stop_condition

    def set_max_tool_calls(self, max_tool_calls: int) -> None:
        """Forwards a rollout-level tool-call limit to the inner env (warns if it has none)."""
        setter = getattr(self.message_env, "set_max_tool_calls", None)
        if setter is None:
            logger.warning(
                "max_tool_calls=%d is configured, but %s does not support a tool-call limit; "
                "the limit will not be enforced.",
                max_tool_calls,
                type(self.message_env).__name__,
            )
            return
        setter(max_tool_calls)
