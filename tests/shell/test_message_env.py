"""`shell.agents._message_env`: rendering, overflow, truncation, parse failures and the runner seams.

The renderer is `role_colon` on the tiny byte tokenizer (stop string `"\\n\\nUser:"`); the
message env is a small scripted conversation that echoes the assistant's text back as the
next user turn, so each step's next prompt is the renderer's rendering of a known history.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from rlpure.records import InitialObservationOverflow, StepResult
from shell.agents._message_env import EnvFromMessageEnv, MessageEnv, MessageStepResult
from shell.chat._base import Message
from shell.cookbook import renderers, tokenizer_utils
from shell.cookbook.rl.types import PARSE_ERROR_MASKED_METRIC_KEY
from shell.rollouts import ParseErrorPolicy

TOK = tokenizer_utils.get_tokenizer("rlpure/tiny")
RENDERER = renderers.get_renderer("role_colon", TOK)


def _action(text: str) -> list[int]:
    return tokenizer_utils.encode_without_special_tokens(TOK, text)


class EchoEnv(MessageEnv):
    """Ends after `turns` turns with reward 1.0; each turn's user reply repeats the assistant."""

    def __init__(self, prompt: str = "hi", *, turns: int = 2, truncation: bool = False) -> None:
        self.history: list[Message] = [{"role": "user", "content": prompt}]
        self.turns = turns
        self.truncation = truncation
        self.stepped: list[Message] = []

    async def initial_observation(self) -> list[Message]:
        return self.history

    async def step(self, message: Message) -> MessageStepResult:
        self.stepped.append(message)
        self.history.append(message)
        done = len(self.stepped) >= self.turns
        if not done:
            self.history.append({"role": "user", "content": f"again: {message['content']}"})
        return MessageStepResult(
            reward=1.0 if done else 0.0,
            episode_done=done,
            next_messages=self.history,
            metrics={"turn": float(len(self.stepped))},
            logs={"said": str(message["content"])},
        )

    async def observe_truncated_response(self, message: Message) -> list[Message] | None:
        if not self.truncation:
            return None
        self.history.append(message)
        return self.history

    async def add_messages(self, messages: list[Message]) -> list[Message] | None:
        self.history.extend(messages)
        return self.history


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_renders_prompts_and_steps_the_message_env() -> None:
    inner = EchoEnv()
    env = EnvFromMessageEnv(RENDERER, inner)
    observation, stop = _run(env.initial_observation())
    assert observation.to_ints() == RENDERER.build_generation_prompt(inner.history[:1]).to_ints()
    assert list(stop) == RENDERER.get_stop_sequences()
    first = _run(env.step(_action("hello\n\nUser:")))
    assert inner.stepped[0]["content"] == "hello"
    assert (first.reward, first.episode_done, first.metrics, first.logs["said"]) == (
        0.0,
        False,
        {"turn": 1.0},
        "hello",
    )
    expected = RENDERER.build_generation_prompt(inner.history).to_ints()
    assert first.next_observation.to_ints() == expected
    last = _run(env.step(_action("bye\n\nUser:"), extra={"stop_reason": "stop"}))
    assert (last.reward, last.episode_done) == (1.0, True)


def test_an_initial_prompt_too_long_for_the_context_is_an_overflow_not_a_crash() -> None:
    env = EnvFromMessageEnv(
        RENDERER,
        EchoEnv("x" * 100),
        max_trajectory_tokens=100,
        max_generation_tokens=8,
        context_overflow_reward=-0.5,
    )
    overflow = _run(env.initial_observation())
    assert isinstance(overflow, InitialObservationOverflow)
    assert overflow.reward == -0.5
    assert overflow.metrics == {"max_tokens_reached": 1.0, "stop/max_tokens": 1.0}
    assert "exceeds max_trajectory_tokens (100)" in str(
        overflow.logs["initial_observation_overflow"]
    )


def _overflowing_step(inner: EchoEnv) -> StepResult:
    """The step of `inner` (5 turns) whose next prompt would not fit 30 tokens past the first."""
    start = RENDERER.build_generation_prompt(inner.history).length
    env = EnvFromMessageEnv(
        RENDERER, inner, max_trajectory_tokens=start + 30, max_generation_tokens=10
    )
    _run(env.initial_observation())
    result: StepResult = _run(env.step(_action("a longer reply than fits\n\nUser:")))
    return result


def test_a_next_prompt_that_would_overflow_ends_with_context_overflow() -> None:
    result = _overflowing_step(EchoEnv(turns=5))
    assert (result.reward, result.episode_done, result.next_observation.length) == (-0.1, True, 0)
    assert result.metrics == {"turn": 1.0, "context_overflow": 1.0, "stop/context_overflow": 1.0}
    assert result.logs["said"] == "a longer reply than fits"


def test_an_overflow_keeps_inner_metrics_whatever_their_names() -> None:
    # the inner env's metrics went in as keyword arguments of a helper with its own parameter
    # `reason`: a metric of that name raised TypeError
    class Reasoned(EchoEnv):
        async def step(self, message: Message) -> MessageStepResult:
            result = await super().step(message)
            return msgspec.structs.replace(result, metrics={"reason": 1.0})

    result = _overflowing_step(Reasoned(turns=5))
    assert result.metrics == {"reason": 1.0, "context_overflow": 1.0, "stop/context_overflow": 1.0}


def test_an_episode_that_ends_keeps_its_reward_even_past_the_budget() -> None:
    inner = EchoEnv(turns=1)
    start = RENDERER.build_generation_prompt(inner.history).length
    env = EnvFromMessageEnv(RENDERER, inner, max_trajectory_tokens=start + 1)
    _run(env.initial_observation())
    result = _run(env.step(_action("a long final answer\n\nUser:")))
    assert (result.reward, result.episode_done) == (1.0, True)
    assert "context_overflow" not in result.metrics


def test_truncation_is_not_a_parse_error() -> None:
    env = EnvFromMessageEnv(RENDERER, EchoEnv(), context_overflow_reward=-0.2)
    _run(env.initial_observation())
    result = _run(env.step(_action("cut off mid"), extra={"stop_reason": "length"}))
    assert (result.reward, result.episode_done) == (-0.2, True)
    assert result.metrics == {"max_tokens_reached": 1.0, "stop/max_tokens": 1.0}
    assert "parse_error" not in result.metrics


def test_continuation_past_truncation_keeps_the_turn_when_the_env_records_it() -> None:
    inner = EchoEnv(truncation=True)
    env = EnvFromMessageEnv(RENDERER, inner, terminate_on_length=False)
    _run(env.initial_observation())
    result = _run(env.step(_action("cut off mid"), extra={"stop_reason": "length"}))
    assert (result.reward, result.episode_done, result.metrics) == (0.0, False, {})
    assert "truncated_turn" in result.logs
    assert inner.history[-1]["content"] == "cut off mid" and not inner.stepped
    assert result.next_observation.to_ints() == (
        RENDERER.build_generation_prompt(inner.history).to_ints()
    )
    # an env that cannot record truncated turns falls back to ending the episode
    fallback = EnvFromMessageEnv(RENDERER, EchoEnv(), terminate_on_length=False)
    _run(fallback.initial_observation())
    ended = _run(fallback.step(_action("cut"), extra={"stop_reason": "length"}))
    assert ended.episode_done and ended.metrics["stop/max_tokens"] == 1.0


@pytest.mark.parametrize("terminate", [True, False])
def test_a_response_without_its_stop_is_a_parse_error(terminate: bool) -> None:
    env = EnvFromMessageEnv(
        RENDERER, EchoEnv(), failed_parse_reward=-0.7, terminate_on_parse_error=terminate
    )
    _run(env.initial_observation())
    result = _run(env.step(_action("never stops")))
    assert (result.reward, result.episode_done) == (-0.7, terminate)
    expected = {"parse_error": 1.0} | ({"stop/parse_error": 1.0} if terminate else {})
    assert result.metrics == expected


def test_a_parse_error_policy_ends_structural_failures_with_its_reward() -> None:
    policy = ParseErrorPolicy(terminal_reward=-2.0, mask_error_turns=True)
    env = EnvFromMessageEnv(RENDERER, EchoEnv(), terminate_on_parse_error=False)
    env.set_parse_error_policy(policy)
    _run(env.initial_observation())
    result = _run(env.step(_action("never stops")))
    assert (result.reward, result.episode_done) == (-2.0, True)
    assert result.metrics == {
        "parse_error": 1.0,
        "stop/parse_error": 1.0,
        PARSE_ERROR_MASKED_METRIC_KEY: 1.0,
    }
    assert result.logs["parse_failure_kind"]


def test_injected_messages_are_rendered_and_unsupported_seams_say_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inner = EchoEnv()
    env = EnvFromMessageEnv(RENDERER, inner)
    _run(env.initial_observation())
    prompt, _stop = _run(env.inject_messages([{"role": "user", "content": "hint"}]))
    assert prompt.to_ints() == RENDERER.build_generation_prompt(inner.history).to_ints()
    env.set_max_tool_calls(3)
    assert "does not support a tool-call limit" in caplog.text

    class Plain(MessageEnv):
        async def initial_observation(self) -> list[Message]:
            return []

        async def step(self, message: Message) -> MessageStepResult:
            return MessageStepResult(0.0, True, [])

    with pytest.raises(TypeError, match="Plain does not support message injection"):
        _run(EnvFromMessageEnv(RENDERER, Plain()).inject_messages([]))
