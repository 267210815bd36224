"""The agent demo's task: two-digit arithmetic answered through a `calculator` tool.

Part of `rlpure agent` (see `shell.jobs.tools`). Conventions:
- A problem is `a op b` with `a, b in [min_operand, max_operand]` and `op in OPS`; the question
  is `"What is {a}{op}{b}?"`. The policy may call `calculator(expr="a op b")` (a `@tool`
  `FunctionTool`; a malformed expression is an `execution_failed` tool error, counted in the
  `tool_error/*` metrics) and must end with a turn that calls no tool and writes `\\boxed{N}`.
- Reward (graded once, on the final assistant message): 1 when `N` is the answer, 0 for a
  wrong number, `-format_coef` without a `\\boxed{}` integer; a response that never reached
  its stop sequence or whose only tool calls were malformed ends the episode with
  `-format_coef` (`failed_parse_reward`). Episode metrics, for every episode (graded from its
  conversation in `compute_group_rewards`, so episodes that ended on a parse error count as
  wrong instead of being left out of the means): `correct`, `format`, `used_tool` (the
  episode got a tool result); beside them `AgentToolMessageEnv`'s stop reasons, tool errors
  and parse errors.
- The warm-up corpus (`corpus_conversations`) is imperfect on purpose: with probability
  `p_tool` a transcript calls the calculator with the question's operands and copies its
  result (right); otherwise it answers at once with a near miss (`answer ± 1..3`, wrong). A
  model fitted to it uses the tool about `p_tool` of the time and answers directly (wrongly)
  otherwise; GRPO has to find and reinforce the tool-using behaviour.
- `AgentDataset` batch `i` draws `groups_per_batch` training problems with `fold_in(key, i)`;
  `key=None` gives one batch of the problems in order (evaluation).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated

import jax
import msgspec
import numpy as np

from rlpure.records import Metrics, Trajectory
from rlpure.tasks.arithmetic import batch_problem_indices, check_problem_batches
from shell.agents import (
    AgentToolMessageEnv,
    FunctionTool,
    ToolResult,
    build_agent_tool_env,
    simple_tool_result,
    tool,
)
from shell.agents._message_env import EnvFromMessageEnv
from shell.chat import Message, Renderer, ToolCall, get_text_content
from shell.env import Env, EnvGroupBuilder, RLDataset

__all__ = [
    "OPS",
    "AgentDataset",
    "AgentGroupBuilder",
    "ToolProblem",
    "calculator",
    "corpus_conversations",
    "grade_messages",
    "split_tool_problems",
]

OPS = ("+", "*")
"""The operators of the task (the calculator also takes `-`)."""

_EXPRESSION = re.compile(r"\s*(-?\d{1,9})\s*([+\-*])\s*(-?\d{1,9})\s*")
_BOXED = re.compile(r"\\boxed\{(-?\d+)\}")


class ToolProblem(msgspec.Struct, frozen=True, kw_only=True):
    """One question `a op b`.

    Attributes:
        a: left operand.
        op: `"+"` or `"*"`.
        b: right operand.
    """

    a: int
    op: str
    b: int

    @property
    def expression(self) -> str:
        """`"{a}{op}{b}"`."""
        return f"{self.a}{self.op}{self.b}"

    @property
    def question(self) -> str:
        """`"What is {a}{op}{b}?"`."""
        return f"What is {self.expression}?"

    @property
    def answer(self) -> int:
        """The exact result."""
        return _apply(self.a, self.op, self.b)


def _apply(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"calculator: unknown operator {op!r}")


@tool
def calculator(
    expr: Annotated[str, "an expression 'a op b': integers a, b; op one of + - *"],
) -> ToolResult:
    """Evaluates an integer expression 'a op b' exactly."""
    match = _EXPRESSION.fullmatch(expr)
    if match is None:
        raise ValueError(f"expected 'a op b' with integers and op in + - *, got {expr!r}")
    a, op, b = match.groups()
    return simple_tool_result(str(_apply(int(a), op, int(b))))


def _calculator_call(expr: str) -> ToolCall:
    body = ToolCall.FunctionBody(name="calculator", arguments=json.dumps({"expr": expr}))
    return ToolCall(function=body)


def grade_messages(
    messages: Sequence[Message], problem: ToolProblem, *, format_coef: float
) -> tuple[float, Metrics]:
    """The episode's reward and metrics from its messages (see the module docstring)."""
    final = next((m for m in reversed(messages) if m["role"] == "assistant"), None)
    found = _BOXED.findall(get_text_content(final)) if final is not None else []
    used_tool = any(m["role"] == "tool" for m in messages)
    correct = bool(found) and int(found[-1]) == problem.answer
    reward = 1.0 if correct else (0.0 if found else -format_coef)
    return reward, {
        "correct": float(correct),
        "format": float(bool(found)),
        "used_tool": float(used_tool),
    }


def split_tool_problems(
    key: jax.Array, *, min_operand: int, max_operand: int, num_train: int, num_test: int
) -> tuple[tuple[ToolProblem, ...], tuple[ToolProblem, ...]]:
    """`(train, test)`: distinct problems drawn with `key`, disjoint.

    Raises:
        ValueError: fewer than `num_train + num_test` problems exist.
    """
    span = max_operand - min_operand + 1
    total = span * span * len(OPS)
    if num_train + num_test > total:
        raise ValueError(
            f"split_tool_problems: {num_train} + {num_test} problems asked, {total} exist"
        )
    index = np.asarray(
        jax.random.choice(key, total, (num_train + num_test,), replace=False)
    ).tolist()
    problems = []
    for i in index:
        op_index, rest = divmod(int(i), span * span)
        a, b = divmod(rest, span)
        problems.append(ToolProblem(a=min_operand + a, op=OPS[op_index], b=min_operand + b))
    return tuple(problems[num_test:]), tuple(problems[:num_test])


def corpus_conversations(
    key: jax.Array, problems: Sequence[ToolProblem], *, p_tool: float
) -> list[list[Message]]:
    """One warm-up transcript per problem (tool and right, or direct and a near miss).

    Args:
        key: JAX key of the choices.
        problems: the transcripts' questions.
        p_tool: probability that a transcript uses the calculator.
    """
    tool_key, miss_key = jax.random.split(key)
    uses_P = np.asarray(jax.random.uniform(tool_key, (len(problems),)) < p_tool).tolist()
    miss_P = np.asarray(jax.random.randint(miss_key, (len(problems),), 1, 4)).tolist()
    sign_P = np.asarray(jax.random.bernoulli(miss_key, 0.5, (len(problems),))).tolist()
    conversations: list[list[Message]] = []
    for problem, uses, miss, sign in zip(problems, uses_P, miss_P, sign_P, strict=True):
        messages: list[Message] = [{"role": "user", "content": problem.question}]
        if uses:
            messages += [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [_calculator_call(problem.expression)],
                },
                {"role": "tool", "content": str(problem.answer), "name": "calculator"},
                {"role": "assistant", "content": f"\\boxed{{{problem.answer}}}"},
            ]
        else:
            guess = problem.answer + (miss if sign else -miss)
            messages.append({"role": "assistant", "content": f"\\boxed{{{guess}}}"})
        conversations.append(messages)
    return conversations


@dataclass
class AgentGroupBuilder(EnvGroupBuilder):
    """`group_size` tool-using envs (`build_agent_tool_env`) on one problem.

    Attributes:
        problem: the question.
        renderer: renders the conversation (`agent_renderer`: `RoleColonToolRenderer` for the
            toy model, `smollm2` for SmolLM2).
        group_size: envs in the group.
        max_turns: assistant turns per episode.
        format_coef: penalty of a final answer without `\\boxed{}`.
        tools: the tools the env runs.
        convo_prefix: messages before the question (a chat model's system message declaring
            the tools; empty for the toy model, which learns the call from its warm-up alone).
    """

    problem: ToolProblem
    renderer: Renderer
    group_size: int
    max_turns: int = 3
    format_coef: float = 0.1
    tools: tuple[FunctionTool, ...] = field(default=(calculator,))
    convo_prefix: tuple[Message, ...] = ()

    async def make_envs(self) -> Sequence[Env]:
        problem, format_coef = self.problem, self.format_coef

        async def reward_fn(messages: list[Message]) -> tuple[float, dict[str, float]]:
            # The metrics come from compute_group_rewards, for every episode: an episode that
            # ends on a parse error is never graded here, and a metric only some episodes carry
            # would be averaged over those alone (the cookbook's dict_mean).
            return grade_messages(messages, problem, format_coef=format_coef)[0], {}

        return [
            build_agent_tool_env(
                self.renderer,
                list(self.tools),
                [*self.convo_prefix, {"role": "user", "content": problem.question}],
                reward_fn,
                max_turns=self.max_turns,
                failed_parse_reward=-format_coef,
                tool_timeout_seconds=5.0,
            )
            for _ in range(self.group_size)
        ]

    async def compute_group_rewards(
        self, trajectory_group: list[Trajectory], env_group: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        """Zero reward (the episode's is given on its last step) and every episode's
        `correct` / `format` / `used_tool`, graded from its conversation."""
        out: list[tuple[float, Metrics]] = []
        for env in env_group:
            inner = env.message_env if isinstance(env, EnvFromMessageEnv) else None
            history = inner.history if isinstance(inner, AgentToolMessageEnv) else []
            metrics = grade_messages(history, self.problem, format_coef=self.format_coef)[1]
            out.append((0.0, metrics))
        return out

    def logging_tags(self) -> list[str]:
        return ["calculator"]


class AgentDataset(RLDataset):
    """Batches of `AgentGroupBuilder`s (see the module docstring).

    Args:
        problems: the problems to draw from.
        renderer: the renderer.
        num_batches: number of batches.
        groups_per_batch: problems per batch (at most `len(problems)`).
        group_size: envs per problem.
        key: JAX key (None: one batch of the first `groups_per_batch` problems, in order).
        max_turns: assistant turns per episode.
        format_coef: penalty of a final answer without `\\boxed{}`.
        convo_prefix: messages before each question (`AgentGroupBuilder.convo_prefix`).
    """

    def __init__(
        self,
        problems: Sequence[ToolProblem],
        renderer: Renderer,
        *,
        num_batches: int,
        groups_per_batch: int,
        group_size: int,
        key: jax.Array | None,
        max_turns: int = 3,
        format_coef: float = 0.1,
        convo_prefix: Sequence[Message] = (),
    ) -> None:
        check_problem_batches("AgentDataset", len(problems), groups_per_batch)
        self.problems = tuple(problems)
        self.renderer = renderer
        self.num_batches = num_batches
        self.groups_per_batch = groups_per_batch
        self.group_size = group_size
        self.key = key
        self.max_turns = max_turns
        self.format_coef = format_coef
        self.convo_prefix = tuple(convo_prefix)

    def __len__(self) -> int:
        return self.num_batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < self.num_batches:
            raise IndexError(f"AgentDataset.get_batch: index {index} not in [0, {len(self)})")
        chosen = batch_problem_indices(self.key, index, len(self.problems), self.groups_per_batch)
        return [
            AgentGroupBuilder(
                self.problems[i],
                self.renderer,
                self.group_size,
                max_turns=self.max_turns,
                format_coef=self.format_coef,
                convo_prefix=self.convo_prefix,
            )
            for i in chosen
        ]
