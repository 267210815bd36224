"""The cookbook's `tinker_cookbook.tool_use.agent_tool_message_env`: a generic tool-using agent env.

`AgentToolMessageEnv` is a `MessageEnv` whose assistant turns may call tools: each turn's
parsed `tool_calls` run through `handle_tool_call` (in parallel by default), their result
messages join the history, and the episode ends when a turn calls no tool (`stop/completed`),
a tool asks to stop (`stop/tool_stopped`), the tool-call budget runs out (`stop/max_tool_calls`;
a batch larger than what is left runs only its allowed prefix), `max_turns` is reached
(`stop/max_turns`) or every call of a turn was malformed (`stop/parse_error`, with
`terminate_on_parse_error`). `reward_fn` grades the finished episode once. Malformed calls
(`unparsed_tool_calls`) set `parse_error` and `logs["parse_errors"]`; a turn with only malformed
calls gets `failed_parse_reward`, or, under a `ParseErrorPolicy`, a corrective user message and
`-penalty_per_error` while the consecutive budget lasts. All of this is the cookbook's.

A dataclass (not a msgspec record) because cookbook recipes subclass it with `@dataclass`.

Additions, on purpose: `tool_timeout_seconds` bounds each tool call (a hanging tool becomes a
`timeout` error result); and a turn whose tool calls came back as errors counts them —
`tool_error` (how many) and `tool_error/<type>` (`tool_not_found`, `json_decode_failed`,
`validation_failed`, `execution_failed`, `timeout`, ...) — where the cookbook records nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from rlpure.records import PARSE_ERROR_MASKED_METRIC_KEY, STOP_METRIC_PREFIX, Logs, StopReason
from shell.agents._message_env import EnvFromMessageEnv, MessageEnv, MessageStepResult
from shell.agents._tool_types import Tool, ToolResult
from shell.agents._tools import handle_tool_call
from shell.chat._base import (
    PARSE_FAILURE_DETAIL_MAX_CHARS,
    Message,
    Renderer,
    ToolCall,
    UnparsedToolCall,
    format_content_as_string,
    get_text_content,
)
from shell.rollouts import (
    ParseErrorPolicy,
    RolloutConfig,
    TerminationRewardPolicy,
    ToolExecution,
    default_rollout_config_for_model,
)

__all__ = ["AgentToolMessageEnv", "RewardFn", "RewardResult", "build_agent_tool_env"]

RewardResult = tuple[float, dict[str, float]]
"""What a reward function returns: the episode's reward and its metrics."""

RewardFn = Callable[[list[Message]], Awaitable[RewardResult]]
"""Grades a finished episode from its messages."""


def _stop(metrics: dict[str, float], reason: StopReason) -> None:
    metrics[f"{STOP_METRIC_PREFIX}{reason}"] = 1.0


@dataclass
class AgentToolMessageEnv(MessageEnv):
    """A tool-use `MessageEnv` for agents (see the module docstring for when episodes end).

    Attributes:
        tools: the tools the agent may call.
        initial_messages: the conversation before the first turn.
        max_turns: turns before the episode ends.
        reward_fn: grades the finished episode once.
        failed_parse_reward: reward of a turn whose tool calls were all malformed.
        terminate_on_parse_error: whether such a turn ends the episode.
        max_tool_calls: tool calls allowed per episode; None: no cap.
        parse_error_policy: retries malformed turns with a corrective message when set.
        tool_execution: `"parallel"` (default) or `"sequential"` dispatch of a turn's calls.
        termination_policy: grader scope and timeout when set.
        history: the conversation (filled from `initial_messages` on the first observation).
        tool_timeout_seconds: bound on each tool call; None: none (the cookbook's behaviour).
    """

    tools: list[Tool]
    initial_messages: list[Message]
    max_turns: int
    reward_fn: RewardFn
    failed_parse_reward: float = -0.1
    terminate_on_parse_error: bool = True
    max_tool_calls: int | None = None
    parse_error_policy: ParseErrorPolicy | None = None
    tool_execution: ToolExecution = "parallel"
    termination_policy: TerminationRewardPolicy | None = None
    history: list[Message] = field(default_factory=list)

    _turn_count: int = 0
    _consecutive_parse_errors: int = field(default=0, init=False)
    _tool_calls_made: int = field(default=0, init=False)
    _tool_dict: dict[str, Tool] = field(default_factory=dict, init=False)
    _should_stop: bool = field(default=False, init=False)
    tool_timeout_seconds: float | None = None
    _tool_errors: dict[str, int] = field(default_factory=dict, init=False)  # this turn's, by type

    def __post_init__(self) -> None:
        self._tool_dict = {t.name: t for t in self.tools}
        if self.tool_execution == "concurrent_safe":
            raise NotImplementedError(
                'AgentToolMessageEnv.tool_execution="concurrent_safe" is reserved: the Tool '
                "protocol has no concurrency-safety marker yet. Use 'sequential' or 'parallel'."
            )

    async def initial_observation(self) -> list[Message]:
        """The history, started from `initial_messages` on the first call."""
        if not self.history:
            self.history = list(self.initial_messages)
        return self.history

    def set_max_tool_calls(self, max_tool_calls: int) -> None:
        """Applies a rollout-level tool-call cap; the tighter of it and the env's wins."""
        current = self.max_tool_calls
        self.max_tool_calls = max_tool_calls if current is None else min(current, max_tool_calls)

    def set_parse_error_policy(self, policy: ParseErrorPolicy) -> None:
        """Applies a rollout-level parse-error policy."""
        self.parse_error_policy = policy

    async def observe_truncated_response(self, message: Message) -> list[Message]:
        """Appends a truncated turn as-is: no tools run, no counter moves."""
        self.history.append(message)
        return self.history

    async def add_messages(self, messages: list[Message]) -> list[Message]:
        """Appends injected messages."""
        self.history.extend(messages)
        return self.history

    async def _run_tool_call(self, tool_call: ToolCall) -> ToolResult:
        return await handle_tool_call(
            self._tool_dict, tool_call, timeout_seconds=self.tool_timeout_seconds
        )

    async def _handle_tool_calls(self, tool_calls: list[ToolCall]) -> list[Message]:
        """Runs the calls (in request order for results), appends and returns their messages."""
        if self.tool_execution == "sequential":
            results = [await self._run_tool_call(tc) for tc in tool_calls]
        else:
            results = list(await asyncio.gather(*map(self._run_tool_call, tool_calls)))
        messages: list[Message] = []
        for result in results:
            self.history.extend(result.messages)
            messages.extend(result.messages)
            self._should_stop = self._should_stop or result.should_stop
            error = result.metadata.get("error")
            if error is not None:
                self._tool_errors[str(error)] = self._tool_errors.get(str(error), 0) + 1
        return messages

    async def step(self, message: Message) -> MessageStepResult:
        """Runs the turn's tool calls and says whether (and how) the episode ended."""
        self._turn_count += 1
        self._tool_errors.clear()
        metrics: dict[str, float] = {}
        logs: Logs = {}
        self.history.append(message)
        text = get_text_content(message)
        if text:
            logs["assistant_content"] = text

        tool_calls: list[ToolCall] = list(message.get("tool_calls") or [])
        unparsed: list[UnparsedToolCall] = list(message.get("unparsed_tool_calls") or [])
        max_turns_reached = self._turn_count >= self.max_turns
        if unparsed:
            metrics["parse_error"] = 1.0
            logs["parse_errors"] = "\n".join(tc.error for tc in unparsed)

        if unparsed and not tool_calls:  # every call malformed: a content parse failure
            return self._malformed_turn_step(unparsed, metrics, logs, max_turns_reached)
        self._consecutive_parse_errors = 0

        to_run = tool_calls
        capped = False
        if tool_calls and self.max_tool_calls is not None:
            left = max(self.max_tool_calls - self._tool_calls_made, 0)
            if len(tool_calls) > left:
                capped, to_run = True, tool_calls[:left]
                logs["tool_calls_dropped"] = (
                    f"{len(tool_calls) - left} tool call(s) dropped: "
                    f"max_tool_calls={self.max_tool_calls} reached"
                )
        if to_run:
            for i, tc in enumerate(to_run):
                logs[f"tool_call_{i}"] = f"{tc.function.name}({tc.function.arguments})"
            results = await self._handle_tool_calls(to_run)
            self._tool_calls_made += len(to_run)
            for i, result_message in enumerate(results):
                logs[f"tool_result_{i}"] = format_content_as_string(result_message["content"])
            if self._tool_errors:
                metrics["tool_error"] = float(sum(self._tool_errors.values()))
                for kind, count in self._tool_errors.items():
                    metrics[f"tool_error/{kind}"] = float(count)

        no_tool_calls = not tool_calls
        done = no_tool_calls or max_turns_reached or self._should_stop or capped
        if max_turns_reached and not no_tool_calls:
            metrics["max_turns"] = 1.0
        if self._should_stop:
            metrics["tool_stopped"] = 1.0
        if capped:
            metrics["max_tool_calls"] = 1.0
        reward = 0.0
        if done:
            if no_tool_calls:
                _stop(metrics, StopReason.COMPLETED)
            elif self._should_stop:
                _stop(metrics, StopReason.TOOL_STOPPED)
            elif capped:
                _stop(metrics, StopReason.MAX_TOOL_CALLS)
            else:
                _stop(metrics, StopReason.MAX_TURNS)
            reward, reward_metrics = await self._grade()
            metrics.update(reward_metrics)
        return MessageStepResult(
            reward=reward, episode_done=done, next_messages=self.history, metrics=metrics, logs=logs
        )

    async def _grade(self) -> RewardResult:
        """`reward_fn` on the history (only the rollout's suffix under a termination policy
        that does not pass all messages), bounded by the policy's grader timeout.

        Raises:
            TimeoutError: the grader ran past `grader_timeout_seconds` (no usable reward).
        """
        policy = self.termination_policy
        messages = self.history
        if policy is not None and not policy.pass_all_messages_to_grader:
            messages = self.history[len(self.initial_messages) :]
        timeout = None if policy is None else policy.grader_timeout_seconds
        async with asyncio.timeout(timeout):
            return await self.reward_fn(messages)

    def _malformed_turn_step(
        self,
        unparsed: list[UnparsedToolCall],
        metrics: dict[str, float],
        logs: Logs,
        max_turns_reached: bool,
    ) -> MessageStepResult:
        """A turn whose tool calls were all malformed: `failed_parse_reward`, or the policy's."""
        self._consecutive_parse_errors += 1
        if self.parse_error_policy is not None:
            return self._content_parse_error_step(unparsed, metrics, logs, max_turns_reached)
        done = self.terminate_on_parse_error or max_turns_reached
        if max_turns_reached:
            metrics["max_turns"] = 1.0
        if done:
            _stop(metrics, StopReason.PARSE_ERROR)
        return MessageStepResult(
            reward=self.failed_parse_reward,
            episode_done=done,
            next_messages=self.history,
            metrics=metrics,
            logs=logs,
        )

    def _content_parse_error_step(
        self,
        unparsed: list[UnparsedToolCall],
        metrics: dict[str, float],
        logs: Logs,
        max_turns_reached: bool,
    ) -> MessageStepResult:
        """A malformed-only turn under `parse_error_policy`: retry while the budget lasts."""
        policy = self.parse_error_policy
        if policy is None:
            raise ValueError("AgentToolMessageEnv: a content parse-error step needs a policy")
        logs["parse_failure_kind"] = "content"
        if policy.mask_error_turns:
            metrics[PARSE_ERROR_MASKED_METRIC_KEY] = 1.0
        if self._consecutive_parse_errors <= policy.max_consecutive and not max_turns_reached:
            details = "\n".join(tc.error for tc in unparsed)[:PARSE_FAILURE_DETAIL_MAX_CHARS]
            self.history.append(
                {"role": "user", "content": policy.retry_message_template.format(details=details)}
            )
            logs["parse_error_retry"] = (
                f"injected corrective message (consecutive parse error "
                f"{self._consecutive_parse_errors}, budget {policy.max_consecutive})"
            )
            return MessageStepResult(
                reward=-policy.penalty_per_error,
                episode_done=False,
                next_messages=self.history,
                metrics=metrics,
                logs=logs,
            )
        if max_turns_reached:
            metrics["max_turns"] = 1.0
        _stop(metrics, StopReason.PARSE_ERROR)
        return MessageStepResult(
            reward=policy.terminal_reward,
            episode_done=True,
            next_messages=self.history,
            metrics=metrics,
            logs=logs,
        )


def build_agent_tool_env(
    renderer: Renderer,
    tools: list[Tool],
    initial_messages: list[Message],
    reward_fn: RewardFn,
    *,
    rollout_config: RolloutConfig | None = None,
    model_name: str | None = None,
    max_turns: int | None = None,
    failed_parse_reward: float = -0.1,
    terminate_on_parse_error: bool = True,
    max_tool_calls: int | None = None,
    max_trajectory_tokens: int | None = None,
    max_generation_tokens: int | None = None,
    context_overflow_reward: float = -0.1,
    terminate_on_length: bool | None = None,
    parse_error_policy: ParseErrorPolicy | None = None,
    tool_timeout_seconds: float | None = None,
) -> EnvFromMessageEnv:
    """An `EnvFromMessageEnv` over an `AgentToolMessageEnv`, configured as the cookbook's.

    `rollout_config` (or, without it, `model_name`'s default config) supplies what an explicit
    keyword does not: `limits.max_turns` (else 5), `parse_errors`, `limits.max_tool_calls`
    (the tighter of it and `max_tool_calls`), `tool_execution`, `termination`; a cumulative token
    budget in its limits makes `terminate_on_length` default to False (the runner owns length
    handling) and the limits travel as `rollout_limits`. `tool_timeout_seconds` (ours) bounds
    each tool call. The other arguments are `EnvFromMessageEnv`'s / `AgentToolMessageEnv`'s.
    """
    cfg = rollout_config
    if cfg is None and model_name is not None:
        cfg = default_rollout_config_for_model(model_name)
    if max_turns is None:
        max_turns = 5
        if cfg is not None and cfg.limits.max_turns is not None:
            max_turns = cfg.limits.max_turns
    if parse_error_policy is None and cfg is not None:
        parse_error_policy = cfg.parse_errors
    if cfg is not None and cfg.limits.max_tool_calls is not None:
        cap = cfg.limits.max_tool_calls
        max_tool_calls = cap if max_tool_calls is None else min(max_tool_calls, cap)
    if terminate_on_length is None:
        terminate_on_length = cfg is None or (
            cfg.limits.max_trajectory_tokens is None
            and cfg.limits.max_sampled_tokens is None
            and cfg.limits.max_turn_tokens is None
        )
    message_env = AgentToolMessageEnv(
        tools=tools,
        initial_messages=initial_messages,
        max_turns=max_turns,
        reward_fn=reward_fn,
        failed_parse_reward=failed_parse_reward,
        terminate_on_parse_error=terminate_on_parse_error,
        max_tool_calls=max_tool_calls,
        parse_error_policy=parse_error_policy,
        tool_execution=cfg.tool_execution if cfg is not None else "parallel",
        termination_policy=cfg.termination if cfg is not None else None,
        tool_timeout_seconds=tool_timeout_seconds,
    )
    return EnvFromMessageEnv(
        renderer=renderer,
        message_env=message_env,
        failed_parse_reward=failed_parse_reward,
        terminate_on_parse_error=terminate_on_parse_error,
        max_trajectory_tokens=max_trajectory_tokens,
        max_generation_tokens=max_generation_tokens,
        context_overflow_reward=context_overflow_reward,
        terminate_on_length=terminate_on_length,
        parse_error_policy=parse_error_policy,
        rollout_limits=cfg.limits if cfg is not None else None,
    )
