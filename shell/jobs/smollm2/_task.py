"""The SmolLM2 recipe's task: single-digit addition asked in chat, answered with only the number.

Part of `rlpure train smollm2-addition` (see `shell.jobs.smollm2`). The envs and batches are
the demo's (`shell.jobs.demo.ArithmeticEnv`, `ArithmeticDataset`) with a conversation
prefix: a system message (`SYSTEM_PROMPT`) and three worked examples (`FEWSHOT`: `2+3` → `5`,
`6+7` → `13`, `4+0` → `4`) before the question `"a+b"`
(`rlpure.tasks.arithmetic.problem_question`), rendered by the `smollm2` chat renderer (ChatML). A response is well formed only if it ends on `<|im_end|>` and
its text is a bare integer (`rlpure.tasks.arithmetic.check_answer_format`: `"8"` or `"=8"`,
nothing else, no spaces); it is correct only if that integer is the sum. Reward (`ProblemEnv`):
`correct - format_coef * (1 - format)`.

Problems the few-shot examples show are removed from both halves of the split
(`addition_split`), so no held-out question is answered in its own prompt.

Why these examples: the base model does not add in this format, it guesses, and what it guesses
follows the examples' answers. After the earlier pair (`12+7` → `19`, `5+8` → `13`, both answers
"1x") its greedy reply to all 100 single-digit problems was "12" 44 times and "10" 34 times
(15% right, nearly all on sums 10-12). Sampled at temperature 0.7 the only groups with a right
reply, hence the only ones GRPO trains on, were then mostly the sums the favourite guess fits,
so a step could push "12" onto every problem: the collapse of seed 2 (held-out 0.18 -> 0.05).
With answers of both one and two digits (5, 13, 4) the guesses spread (no reply over 17 of 100,
18% right, spread over sums 0-16), and the right replies GRPO sees are spread too.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence

import jax

from rlpure.render import Renderer
from rlpure.tasks import arithmetic
from rlpure.tasks.arithmetic import ArithmeticProblem, ProblemSplit
from shell.env import EnvGroupBuilder, ProblemEnv, ProblemGroupBuilder
from shell.jobs.demo import ArithmeticDataset

__all__ = [
    "FEWSHOT",
    "SYSTEM_PROMPT",
    "AdditionDataset",
    "addition_prefix",
    "addition_split",
]

SYSTEM_PROMPT = "Reply with only the number."
"""The system message of every prompt (it replaces SmolLM2's default one)."""

FEWSHOT: tuple[tuple[str, str], ...] = (("2+3", "5"), ("6+7", "13"), ("4+0", "4"))
"""Worked examples `(question, answer)` shown before the question, as user/assistant turns."""


def addition_prefix(*, fewshot: bool = True) -> list[dict[str, str]]:
    """The messages before the question: the system message, then (with `fewshot`) the examples.

    Examples:
        >>> [m["role"] for m in addition_prefix()]
        ['system', 'user', 'assistant', 'user', 'assistant', 'user', 'assistant']
        >>> addition_prefix(fewshot=False)
        [{'role': 'system', 'content': 'Reply with only the number.'}]
    """
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    if fewshot:
        for question, answer in FEWSHOT:
            messages += [
                {"role": "user", "content": question},
                {"role": "assistant", "content": answer},
            ]
    return messages


def addition_split(key: jax.Array, *, max_operand: int, num_test: int) -> ProblemSplit:
    """`rlpure.tasks.arithmetic.split_problems`, less the problems `FEWSHOT` answers.

    Raises:
        ValueError: `num_test` leaves no problem for one of the halves.
    """
    split = arithmetic.split_problems(key, max_operand=max_operand, num_test=num_test)
    shown = {question for question, _ in FEWSHOT}

    def keep(problems: Sequence[ArithmeticProblem]) -> tuple[ArithmeticProblem, ...]:
        return tuple(p for p in problems if arithmetic.problem_question(p) not in shown)

    return ProblemSplit(train=keep(split.train), test=keep(split.test))


def _with_prefix(
    make_env: Callable[[], ProblemEnv], prefix: Sequence[Mapping[str, str]]
) -> ProblemEnv:
    env = make_env()
    env.convo_prefix = [dict(m) for m in prefix]
    return env


class AdditionDataset(ArithmeticDataset):
    """The demo's `ArithmeticDataset` (same batches: batch `i` draws `groups_per_batch`
    distinct problems with `fold_in(key, i)`; `key=None` is one batch of every problem in
    order), its envs asking the question after `convo_prefix`, under the tag `"addition"`.

    Args:
        problems: the problems to draw from.
        renderer: the prompt renderer (`smollm2`).
        num_batches: number of batches (`len`).
        groups_per_batch: problems per batch, in `[1, len(problems)]`.
        group_size: envs (samples) per problem.
        key: JAX key of the batches (None: evaluation order).
        convo_prefix: messages before each question (`addition_prefix()`).
        format_coef: reward penalty of a malformed reply.

    Raises:
        ValueError: no problems, or `groups_per_batch` out of range.
    """

    def __init__(
        self,
        problems: Sequence[ArithmeticProblem],
        renderer: Renderer,
        *,
        num_batches: int,
        groups_per_batch: int,
        group_size: int,
        key: jax.Array | None,
        convo_prefix: Sequence[Mapping[str, str]],
        format_coef: float,
    ) -> None:
        super().__init__(
            problems,
            renderer,
            num_batches=num_batches,
            groups_per_batch=groups_per_batch,
            group_size=group_size,
            key=key,
            format_coef=format_coef,
        )
        self.convo_prefix = [dict(m) for m in convo_prefix]

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return [
            dataclasses.replace(
                builder,
                env_thunk=functools.partial(_with_prefix, builder.env_thunk, self.convo_prefix),
                dataset_name="addition",
            )
            for builder in map(_problem_group, super().get_batch(index))
        ]


def _problem_group(builder: EnvGroupBuilder) -> ProblemGroupBuilder:
    if not isinstance(builder, ProblemGroupBuilder):  # the demo's dataset builds only these
        raise TypeError(f"AdditionDataset: expected a ProblemGroupBuilder, got {builder!r}")
    return builder
