"""The SmolLM2 recipe's task: single-digit addition asked in chat, answered with only the number.

Part of `rlpure train smollm2-addition` (see `shell.recipes.smollm2`). The conversation is a
system message (`SYSTEM_PROMPT`), two worked examples (`FEWSHOT`: `12+7` → `19`, `5+8` → `13`)
and the question `"a+b"` (`rlpure.tasks.arithmetic.problem_question`), rendered by the
`smollm2` chat renderer (ChatML). A response is well formed only if it ends on `<|im_end|>` and
its text is a bare integer (`rlpure.tasks.arithmetic.check_answer_format`: `"8"` or `"=8"`,
nothing else, no spaces); it is correct only if that integer is the sum. Reward (`ProblemEnv`):
`correct - format_coef * (1 - format)`.

Problems the few-shot examples show are removed from both halves of the split
(`addition_split`), so no held-out question is answered in its own prompt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import numpy as np

from rlpure.render import Renderer
from rlpure.tasks import arithmetic
from rlpure.tasks.arithmetic import ArithmeticProblem, ProblemSplit
from shell.env import EnvGroupBuilder, ProblemEnv, ProblemGroupBuilder, RLDataset

__all__ = [
    "FEWSHOT",
    "SYSTEM_PROMPT",
    "AdditionDataset",
    "AdditionEnv",
    "addition_prefix",
    "addition_split",
]

SYSTEM_PROMPT = "Reply with only the number."
"""The system message of every prompt (it replaces SmolLM2's default one)."""

FEWSHOT: tuple[tuple[str, str], ...] = (("12+7", "19"), ("5+8", "13"))
"""Worked examples `(question, answer)` shown before the question, as user/assistant turns."""


def addition_prefix(*, fewshot: bool = True) -> list[dict[str, str]]:
    """The messages before the question: the system message, then (with `fewshot`) the examples.

    Examples:
        >>> [m["role"] for m in addition_prefix()]
        ['system', 'user', 'assistant', 'user', 'assistant']
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


class AdditionEnv(ProblemEnv):
    """One `a + b` question in chat; correct iff the reply is exactly the sum (strict format).

    Args:
        problem: the question.
        renderer: the `smollm2` chat renderer (any chat renderer works).
        convo_prefix: messages before the question (`addition_prefix()`).
        format_coef: reward penalty of a malformed reply.
    """

    def __init__(
        self,
        problem: ArithmeticProblem,
        renderer: Renderer,
        *,
        convo_prefix: Sequence[Mapping[str, str]],
        format_coef: float,
    ) -> None:
        super().__init__(renderer, convo_prefix=list(convo_prefix), format_coef=format_coef)
        self.problem = problem

    def get_question(self) -> str:
        return arithmetic.problem_question(self.problem)

    def check_answer(self, sample_str: str) -> bool:
        return arithmetic.grade_response(sample_str, self.problem)

    def check_format(self, sample_str: str) -> bool:
        return arithmetic.check_answer_format(sample_str)

    def get_reference_answer(self) -> str:
        return str(self.problem.answer)


class AdditionDataset(RLDataset):
    """Batches of addition problems; batch `i` draws `groups_per_batch` distinct problems.

    With `key=None` the dataset is one batch of every problem in order (for evaluation).

    Args:
        problems: the problems to draw from.
        renderer: the prompt renderer.
        num_batches: number of batches (`len`).
        groups_per_batch: problems per batch, in `[1, len(problems)]`.
        group_size: envs (samples) per problem.
        key: JAX key; batch `i` draws with `fold_in(key, i)` (None: evaluation order).
        convo_prefix: messages before each question.
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
        if not problems:
            raise ValueError("AdditionDataset.problems: empty")
        if not 1 <= groups_per_batch <= len(problems):
            raise ValueError(
                f"AdditionDataset.groups_per_batch: expected in [1, {len(problems)}], got "
                f"{groups_per_batch}"
            )
        self.problems = tuple(problems)
        self.renderer = renderer
        self.num_batches = num_batches
        self.groups_per_batch = groups_per_batch
        self.group_size = group_size
        self.key = key
        self.convo_prefix = [dict(m) for m in convo_prefix]
        self.format_coef = format_coef

    def __len__(self) -> int:
        return self.num_batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < self.num_batches:
            raise IndexError(f"AdditionDataset.get_batch: index {index} not in [0, {len(self)})")
        if self.key is None:
            chosen = list(range(self.groups_per_batch))
        else:
            chosen = np.asarray(
                jax.random.choice(
                    jax.random.fold_in(self.key, index),
                    len(self.problems),
                    (self.groups_per_batch,),
                    replace=False,
                )
            ).tolist()
        return [self._group(self.problems[i]) for i in chosen]

    def _group(self, problem: ArithmeticProblem) -> ProblemGroupBuilder:
        def make_env() -> ProblemEnv:
            return AdditionEnv(
                problem,
                self.renderer,
                convo_prefix=self.convo_prefix,
                format_coef=self.format_coef,
            )

        return ProblemGroupBuilder(
            env_thunk=make_env, num_envs=self.group_size, dataset_name="addition"
        )
