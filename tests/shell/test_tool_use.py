"""`shell.agents`: `@tool` tools, `handle_tool_call` on bad model output, `AgentToolMessageEnv`.

Messages are built as a renderer's `parse_response` returns them (`tool_calls` of `ToolCall`,
malformed calls in `unparsed_tool_calls`), so the env is tested at the message level; the
rendering path is `tests/shell/test_message_env.py`'s, and the cookbook comparison with a
tool-calling renderer is `tests/parity/test_message_env_parity.py`'s.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated, Any

import pytest
from pydantic import Field

from shell.agents import (
    AgentToolMessageEnv,
    FunctionTool,
    Tool,
    ToolInput,
    ToolResult,
    build_agent_tool_env,
    error_tool_result,
    handle_tool_call,
    simple_tool_result,
    tool,
)
from shell.agents._message_env import EnvFromMessageEnv
from shell.chat._base import Message, ToolCall, UnparsedToolCall
from shell.cookbook import renderers, tokenizer_utils
from shell.rollouts import ParseErrorPolicy, RolloutConfig, RolloutLimits, agentic


@tool
async def add(a: Annotated[int, "first addend"], b: int = 2) -> ToolResult:
    """Adds two integers."""
    return simple_tool_result(str(a + b))


@tool
def explode(reason: str) -> ToolResult:
    """Raises."""
    raise RuntimeError(reason)


@tool
async def wrong_return() -> ToolResult:
    """Returns a string."""
    return "4"  # type: ignore[return-value]


@tool(timeout_seconds=0.05)
async def hang() -> ToolResult:
    """Never returns in time."""
    await asyncio.sleep(30)
    return simple_tool_result("late")


@tool(timeout_seconds=0.05)
def hang_sync() -> ToolResult:
    """A blocking call past its timeout."""
    time.sleep(0.2)
    return simple_tool_result("late")


@tool
async def finish(answer: Annotated[str, Field(description="the answer")]) -> ToolResult:
    """Ends the episode."""
    return simple_tool_result(answer, should_stop=True)


class Counter:
    def __init__(self) -> None:
        self.calls: list[int] = []

    @tool
    async def bump(self, by: int) -> ToolResult:
        """Counts calls."""
        self.calls.append(by)
        return simple_tool_result(str(sum(self.calls)))


class RaisingTool:
    """A hand-written `Tool` whose `run` raises."""

    name = "raising"
    description = "raises"

    @property
    def parameters_schema(self) -> dict[str, Any]:
        return {"type": "object", "properties": {}}

    async def run(self, input: ToolInput) -> ToolResult:
        raise OSError("disk on fire")

    def to_spec(self) -> Any:
        return {"name": self.name, "description": self.description, "parameters": {}}


_ALL: list[Tool] = [add, explode, wrong_return, hang, hang_sync, finish, RaisingTool()]
TOOLS: dict[str, Tool] = {t.name: t for t in _ALL}


def _call(name: str, arguments: str, call_id: str | None = "c1") -> ToolCall:
    return ToolCall(function=ToolCall.FunctionBody(name=name, arguments=arguments), id=call_id)


def _handle(name: str, arguments: str) -> ToolResult:
    return asyncio.run(handle_tool_call(TOOLS, _call(name, arguments)))


def _error(result: ToolResult) -> tuple[str | None, str]:
    content = result.messages[0]["content"]
    assert isinstance(content, str)
    return result.metadata.get("error"), json.loads(content)["error"]


def test_tool_spec_comes_from_the_signature_and_docstring() -> None:
    spec = add.to_spec()
    assert (spec["name"], spec["description"]) == ("add", "Adds two integers.")
    parameters = spec["parameters"]
    assert parameters["required"] == ["a"]
    assert parameters["properties"]["a"] == {
        "description": "first addend",
        "title": "A",
        "type": "integer",
    }
    assert parameters["properties"]["b"]["default"] == 2
    assert finish.parameters_schema["properties"]["answer"]["description"] == "the answer"
    assert isinstance(add, FunctionTool) and isinstance(add, Tool)


def test_a_good_call_runs_and_gets_its_id_and_name() -> None:
    result = _handle("add", '{"a": 1, "b": 5}')
    assert result.messages == [
        {"role": "tool", "content": "6", "tool_call_id": "c1", "name": "add"}
    ]
    assert result.metadata == {}


def test_tool_methods_bind_to_their_instance() -> None:
    counter = Counter()
    bump = counter.bump
    assert asyncio.run(bump.run(ToolInput({"by": 3}))).messages[0]["content"] == "3"
    assert asyncio.run(bump.run(ToolInput({"by": 4}))).messages[0]["content"] == "7"
    assert counter.calls == [3, 4]
    assert "self" not in bump.parameters_schema["properties"]


@pytest.mark.parametrize(
    ("name", "arguments", "kind", "text"),
    [
        ("nope", "{}", "tool_not_found", "Tool 'nope' not found"),
        ("add", '{"a": 1', "json_decode_failed", "Failed to parse tool arguments"),
        ("add", '{"a": "one"}', "validation_failed", "Parameter validation failed"),
        ("add", "[1, 2]", "validation_failed", "Parameter validation failed"),
        ("add", "{}", "validation_failed", "Parameter validation failed"),
        ("explode", '{"reason": "boom"}', "execution_failed", "Tool execution failed: boom"),
        ("wrong_return", "{}", "execution_failed", "must return ToolResult, got str"),
        ("raising", "{}", "execution_failed", "Tool execution failed: disk on fire"),
        ("hang", "{}", "timeout", "timed out after 0.05 s"),
        ("hang_sync", "{}", "timeout", "timed out after 0.05 s"),
    ],
)
def test_bad_calls_become_error_results(name: str, arguments: str, kind: str, text: str) -> None:
    result = _handle(name, arguments)
    error_type, message = _error(result)
    assert error_type == kind
    assert text in message
    assert result.messages[0]["role"] == "tool"
    assert result.messages[0]["name"] == name  # type: ignore[typeddict-item]
    assert result.messages[0]["tool_call_id"] == "c1"  # type: ignore[typeddict-item]


def test_handle_tool_call_bounds_a_tool_without_its_own_timeout() -> None:
    @tool
    async def slow() -> ToolResult:
        """Sleeps."""
        await asyncio.sleep(30)
        return simple_tool_result("late")

    result = asyncio.run(
        handle_tool_call({"slow": slow}, _call("slow", "{}"), timeout_seconds=0.05)
    )
    assert _error(result)[0] == "timeout"
    with pytest.raises(ValueError, match="timeout_seconds: expected > 0"):
        FunctionTool(slow._fn, timeout_seconds=0)


def test_handle_tool_call_bounds_a_synchronous_tool_without_its_own_timeout() -> None:
    # it ran in the event loop, where the deadline could not fire: the loop blocked for 3 s
    @tool
    def blocking() -> ToolResult:
        """Blocks."""
        time.sleep(3)
        return simple_tool_result("late")

    async def call() -> tuple[ToolResult, float]:
        start = time.perf_counter()
        result = await handle_tool_call(
            {"blocking": blocking}, _call("blocking", "{}"), timeout_seconds=0.05
        )
        return result, time.perf_counter() - start

    result, seconds = asyncio.run(call())  # (asyncio.run then waits for the thread to end)
    assert _error(result)[0] == "timeout" and seconds < 2.5


@pytest.mark.parametrize("deadline", [None, 5.0])
def test_a_tools_own_timeout_error_is_an_execution_failure(deadline: float | None) -> None:
    # a TimeoutError the tool raises (a socket's) was reported as "timed out after None s"
    @tool
    def upstream() -> ToolResult:
        """Times out upstream."""
        raise TimeoutError("upstream read timed out")

    class Raising:
        name = "custom"

        async def run(self, input: Any) -> ToolResult:
            raise TimeoutError("custom read timed out")

    tools: dict[str, Any] = {"upstream": upstream, "custom": Raising()}
    for name in tools:
        result = asyncio.run(handle_tool_call(tools, _call(name, "{}"), timeout_seconds=deadline))
        assert _error(result) == (
            "execution_failed",
            f"Tool execution failed: {name} read timed out",
        )


def _assistant(text: str = "", *calls: ToolCall, unparsed: tuple[str, ...] = ()) -> Message:
    message: Message = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = list(calls)
    if unparsed:
        message["unparsed_tool_calls"] = [
            UnparsedToolCall(raw_text=f"<tool_call>{raw}</tool_call>", error=f"Invalid JSON: {raw}")
            for raw in unparsed
        ]
    return message


class Grader:
    def __init__(self) -> None:
        self.seen: list[list[Message]] = []

    async def __call__(self, history: list[Message]) -> tuple[float, dict[str, float]]:
        self.seen.append(list(history))
        return 1.0, {"graded": 1.0}


PROMPT: list[Message] = [{"role": "user", "content": "what is 1+2?"}]


def _env(**kwargs: Any) -> tuple[AgentToolMessageEnv, Grader]:
    grader = Grader()
    tools = kwargs.pop("tools", [add, explode, finish, hang])
    env = AgentToolMessageEnv(
        tools=tools,
        initial_messages=list(PROMPT),
        max_turns=kwargs.pop("max_turns", 5),
        reward_fn=grader,
        **kwargs,
    )
    asyncio.run(env.initial_observation())
    return env, grader


def test_a_tool_turn_then_an_answer_grades_once() -> None:
    env, grader = _env()
    first = asyncio.run(env.step(_assistant("calling", _call("add", '{"a": 1}'))))
    assert (first.reward, first.episode_done, first.metrics) == (0.0, False, {})
    assert first.logs["tool_call_0"] == 'add({"a": 1})' and first.logs["tool_result_0"] == "3"
    assert [m["role"] for m in first.next_messages] == ["user", "assistant", "tool"]
    last = asyncio.run(env.step(_assistant("3")))
    assert (last.reward, last.episode_done) == (1.0, True)
    assert last.metrics == {"stop/completed": 1.0, "graded": 1.0}
    assert len(grader.seen) == 1 and len(grader.seen[0]) == 4


def test_tool_errors_are_counted_and_the_episode_goes_on() -> None:
    env, _grader = _env()
    message = _assistant(
        "",
        _call("add", '{"a": "x"}'),
        _call("nope", "{}", call_id="c2"),
        _call("explode", '{"reason": "r"}', call_id="c3"),
        _call("hang", "{}", call_id="c4"),
    )
    result = asyncio.run(env.step(message))
    assert result.episode_done is False
    assert result.metrics == {
        "tool_error": 4.0,
        "tool_error/validation_failed": 1.0,
        "tool_error/tool_not_found": 1.0,
        "tool_error/execution_failed": 1.0,
        "tool_error/timeout": 1.0,
    }
    assert [m.get("tool_call_id") for m in result.next_messages[2:]] == ["c1", "c2", "c3", "c4"]
    clean = asyncio.run(env.step(_assistant("", _call("add", '{"a": 2}'))))
    assert "tool_error" not in clean.metrics  # counted per turn


def test_only_malformed_calls_is_a_parse_failure() -> None:
    env, grader = _env(failed_parse_reward=-0.3)
    result = asyncio.run(env.step(_assistant("", unparsed=("{bad",))))
    assert (result.reward, result.episode_done) == (-0.3, True)
    assert result.metrics == {"parse_error": 1.0, "stop/parse_error": 1.0}
    assert result.logs["parse_errors"] == "Invalid JSON: {bad"
    assert grader.seen == []


def test_mixed_good_and_malformed_calls_run_the_good_ones() -> None:
    env, _grader = _env()
    result = asyncio.run(env.step(_assistant("", _call("add", '{"a": 1}'), unparsed=("{x",))))
    assert (result.reward, result.episode_done, result.metrics) == (
        0.0,
        False,
        {"parse_error": 1.0},
    )
    assert result.next_messages[-1]["content"] == "3"


def test_a_parse_error_policy_retries_then_ends() -> None:
    policy = ParseErrorPolicy(max_consecutive=1, penalty_per_error=0.25, terminal_reward=-1.0)
    env, _grader = _env(parse_error_policy=policy)
    retry = asyncio.run(env.step(_assistant("", unparsed=("{a",))))
    assert (retry.reward, retry.episode_done) == (-0.25, False)
    assert retry.next_messages[-1]["role"] == "user"
    assert "Invalid JSON: {a" in str(retry.next_messages[-1]["content"])
    final = asyncio.run(env.step(_assistant("", unparsed=("{b",))))
    assert (final.reward, final.episode_done) == (-1.0, True)
    assert final.metrics["stop/parse_error"] == 1.0


def test_the_tool_call_cap_runs_the_allowed_prefix_and_stops() -> None:
    env, grader = _env(max_tool_calls=3)
    env.set_max_tool_calls(5)  # the tighter cap wins
    asyncio.run(env.step(_assistant("", _call("add", '{"a": 1}'), _call("add", '{"a": 2}'))))
    result = asyncio.run(
        env.step(_assistant("", _call("add", '{"a": 3}'), _call("add", '{"a": 4}', "c9")))
    )
    assert result.episode_done and result.reward == 1.0
    assert result.metrics["stop/max_tool_calls"] == 1.0 and result.metrics["max_tool_calls"] == 1.0
    assert "1 tool call(s) dropped" in str(result.logs["tool_calls_dropped"])
    assert [m["content"] for m in result.next_messages if m["role"] == "tool"] == ["3", "4", "5"]
    assert len(grader.seen) == 1


def test_max_turns_and_tool_stop_end_the_episode() -> None:
    env, _grader = _env(max_turns=1)
    result = asyncio.run(env.step(_assistant("", _call("add", '{"a": 1}'))))
    assert result.episode_done
    assert result.metrics == {"max_turns": 1.0, "stop/max_turns": 1.0, "graded": 1.0}
    env, _grader = _env()
    stopped = asyncio.run(env.step(_assistant("", _call("finish", '{"answer": "3"}'))))
    assert stopped.episode_done
    assert stopped.metrics == {"tool_stopped": 1.0, "stop/tool_stopped": 1.0, "graded": 1.0}


def test_sequential_execution_keeps_the_models_order() -> None:
    counter = Counter()
    env, _grader = _env(tools=[counter.bump], tool_execution="sequential")
    calls = [_call("bump", json.dumps({"by": by}), f"c{by}") for by in (1, 2, 3)]
    result = asyncio.run(env.step(_assistant("", *calls)))
    assert counter.calls == [1, 2, 3]
    assert [m["content"] for m in result.next_messages if m["role"] == "tool"] == ["1", "3", "6"]
    with pytest.raises(NotImplementedError, match="concurrent_safe"):
        _env(tool_execution="concurrent_safe")


def test_build_agent_tool_env_applies_the_rollout_config() -> None:
    renderer = renderers.get_renderer("role_colon", tokenizer_utils.get_tokenizer("rlpure/tiny"))
    env = build_agent_tool_env(renderer, [add], list(PROMPT), Grader(), rollout_config=agentic())
    inner = env.message_env
    assert isinstance(env, EnvFromMessageEnv) and isinstance(inner, AgentToolMessageEnv)
    assert (inner.max_turns, inner.max_tool_calls, inner.tool_execution) == (10, 30, "sequential")
    assert env.terminate_on_length is False and env.rollout_limits == agentic().limits
    assert env.parse_error_policy is not None and env.parse_error_policy.max_consecutive == 2
    plain = build_agent_tool_env(
        renderer,
        [add],
        list(PROMPT),
        Grader(),
        rollout_config=RolloutConfig(limits=RolloutLimits(max_tool_calls=4)),
        max_tool_calls=2,
        tool_timeout_seconds=1.5,
    )
    plain_inner = plain.message_env
    assert isinstance(plain_inner, AgentToolMessageEnv)
    assert (plain_inner.max_turns, plain_inner.max_tool_calls) == (5, 2)
    assert plain_inner.tool_timeout_seconds == 1.5 and plain.terminate_on_length is True


def test_error_tool_result_is_json() -> None:
    result = error_tool_result("bad", call_id="x", name="t", error_type="rejected")
    assert result.messages[0]["content"] == '{"error": "bad"}'
    assert result.metadata == {"error": "rejected"}
