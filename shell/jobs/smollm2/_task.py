"""The SmolLM2 recipes' task: single-digit addition asked in chat after a few worked examples.

Part of `rlpure train smollm2-addition` and `rlpure demo` (see `shell.jobs.smollm2`). A prompt
is a system message and three examples as user/assistant turns before the question `"a+b"`
(`rlpure.tasks.arithmetic.problem_question`), rendered by the `smollm2` chat renderer (ChatML).
Two prompt and grading styles (`AdditionDataset(worked=...)`):

- **number** (`rlpure train smollm2-addition`): `SYSTEM_PROMPT`, the examples `FEWSHOT`
  (`2+3` → `5`, `6+7` → `13`, `4+0` → `4`); a response is well formed only if its text is a
  bare integer (`rlpure.tasks.arithmetic.check_answer_format`: `"8"` or `"=8"`, nothing else).
- **worked** (`rlpure demo`): `WORKED_SYSTEM_PROMPT`, the examples `WORKED_FEWSHOT`, worked and
  bare answers alternating (`2+3` → `2+3=5`, `6+7` → `13`, `4+0` → `4+0=4`, `1+8` → `9`); a
  response is well formed only if it is the question written out with its result (`"3+5=8"`,
  `rlpure.tasks.worked_addition`): the examples leave the form open, the reward fixes it.

Either way a response must also end on `<|im_end|>`, and it is correct only if well formed and
its integer is the sum. Reward (`ProblemEnv`): `correct - format_coef * (1 - format)`.
Problems the examples show are removed from both halves of the split (`addition_split`), so no
held-out question is answered in its own prompt.

Why the number style's examples: the base model does not add in this format, it guesses, and
what it guesses follows the examples' answers. After the earlier pair (`12+7` → `19`, `5+8` →
`13`, both answers "1x") its greedy reply to all 100 single-digit problems was "12" 44 times
and "10" 34 times (15% right). With answers of both one and two digits (5, 13, 4) the guesses
spread (18% right, spread over sums 0-16), and the right replies GRPO sees are spread too.

Why the worked style: the same model that guesses bare numbers adds well once it writes the
equation out (three worked examples: 78% of 40 problems right, greedy). After the alternating
examples it answers mostly bare under greedy decoding (17.5% of replies worked, so 14% of the
held-out problems right under the strict grade) but writes the equation out in 13% of its
samples at temperature 1, which are mostly right: GRPO finds that form and reinforces it, and
the form carries over to held-out problems (see `shell.jobs.smollm2` for the measurements).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax

from rlpure.render import Renderer
from rlpure.tasks import arithmetic, worked_addition
from rlpure.tasks.arithmetic import (
    ArithmeticProblem,
    ProblemSplit,
    batch_problem_indices,
    check_problem_batches,
)
from shell.env import EnvGroupBuilder, ProblemEnv, ProblemGroupBuilder, RLDataset

__all__ = [
    "FEWSHOT",
    "SYSTEM_PROMPT",
    "WORKED_FEWSHOT",
    "WORKED_SYSTEM_PROMPT",
    "AdditionDataset",
    "AdditionEnv",
    "addition_prefix",
    "addition_split",
]

SYSTEM_PROMPT = "Reply with only the number."
"""The number style's system message (it replaces SmolLM2's default one)."""

FEWSHOT: tuple[tuple[str, str], ...] = (("2+3", "5"), ("6+7", "13"), ("4+0", "4"))
"""The number style's examples `(question, answer)`, shown as user/assistant turns."""

WORKED_SYSTEM_PROMPT = "Answer the sum."
"""The worked style's system message."""

WORKED_FEWSHOT: tuple[tuple[str, str], ...] = (
    ("2+3", "2+3=5"),
    ("6+7", "13"),
    ("4+0", "4+0=4"),
    ("1+8", "9"),
)
"""The worked style's examples: worked and bare answers alternating, a bare one last."""


def addition_prefix(*, fewshot: bool = True, worked: bool = False) -> list[dict[str, str]]:
    """The messages before the question: the system message, then (with `fewshot`) the
    examples, of the number style or (`worked`) the worked one.

    Examples:
        >>> [m["role"] for m in addition_prefix()]
        ['system', 'user', 'assistant', 'user', 'assistant', 'user', 'assistant']
        >>> addition_prefix(fewshot=False)
        [{'role': 'system', 'content': 'Reply with only the number.'}]
        >>> addition_prefix(worked=True)[2]
        {'role': 'assistant', 'content': '2+3=5'}
    """
    system, examples = (
        (WORKED_SYSTEM_PROMPT, WORKED_FEWSHOT) if worked else (SYSTEM_PROMPT, FEWSHOT)
    )
    messages = [{"role": "system", "content": system}]
    if fewshot:
        for question, answer in examples:
            messages += [
                {"role": "user", "content": question},
                {"role": "assistant", "content": answer},
            ]
    return messages


def addition_split(
    key: jax.Array, *, max_operand: int, num_test: int, worked: bool = False
) -> ProblemSplit:
    """`rlpure.tasks.arithmetic.split_problems`, less the problems the examples of the style
    (`FEWSHOT`, or `WORKED_FEWSHOT` with `worked`) answer.

    Raises:
        ValueError: `num_test` leaves no problem for one of the halves.
    """
    split = arithmetic.split_problems(key, max_operand=max_operand, num_test=num_test)
    shown = {question for question, _ in (WORKED_FEWSHOT if worked else FEWSHOT)}

    def keep(problems: Sequence[ArithmeticProblem]) -> tuple[ArithmeticProblem, ...]:
        return tuple(p for p in problems if arithmetic.problem_question(p) not in shown)

    return ProblemSplit(train=keep(split.train), test=keep(split.test))


class AdditionEnv(ProblemEnv):
    """One `a + b` question after `convo_prefix`, graded strictly in the number style or, with
    `worked`, the worked one (see the module docstring)."""

    def __init__(
        self,
        problem: ArithmeticProblem,
        renderer: Renderer,
        *,
        convo_prefix: Sequence[Mapping[str, str]],
        format_coef: float,
        worked: bool,
    ) -> None:
        super().__init__(
            renderer, convo_prefix=[dict(m) for m in convo_prefix], format_coef=format_coef
        )
        self.problem = problem
        self.worked = worked

    def get_question(self) -> str:
        return arithmetic.problem_question(self.problem)

    def check_answer(self, sample_str: str) -> bool:
        if self.worked:
            return worked_addition.grade_worked_response(sample_str, self.problem)
        return arithmetic.grade_response(sample_str, self.problem)

    def check_format(self, sample_str: str) -> bool:
        if self.worked:
            return worked_addition.check_worked_format(sample_str, self.problem)
        return arithmetic.check_answer_format(sample_str)

    def get_reference_answer(self) -> str:
        return str(self.problem.answer)


class AdditionDataset(RLDataset):
    """Batches of addition problems under the tag `"addition"`: batch `i` draws
    `groups_per_batch` distinct problems with `fold_in(key, i)` (the same batch for the same
    key and index, whatever was read before); `key=None` is one batch of every problem in order,
    for evaluation. Each problem is a group of `group_size` `AdditionEnv`s.

    Args:
        problems: the problems to draw from.
        renderer: the prompt renderer (`smollm2`).
        num_batches: number of batches (`len`).
        groups_per_batch: problems per batch, in `[1, len(problems)]`.
        group_size: envs (samples) per problem.
        key: JAX key of the batches (None: evaluation order).
        convo_prefix: messages before each question (`addition_prefix()`).
        format_coef: reward penalty of a malformed reply.
        worked: grade in the worked style (a worked answer `"3+5=8"` counts too).

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
        worked: bool = False,
    ) -> None:
        check_problem_batches("AdditionDataset", len(problems), groups_per_batch)
        self.problems = tuple(problems)
        self.renderer = renderer
        self.num_batches = num_batches
        self.groups_per_batch = groups_per_batch
        self.group_size = group_size
        self.key = key
        self.convo_prefix = [dict(m) for m in convo_prefix]
        self.format_coef = format_coef
        self.worked = worked

    def __len__(self) -> int:
        return self.num_batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < self.num_batches:
            raise IndexError(f"AdditionDataset.get_batch: index {index} not in [0, {len(self)})")
        chosen = batch_problem_indices(self.key, index, len(self.problems), self.groups_per_batch)
        return [self._group(self.problems[i]) for i in chosen]

    def _group(self, problem: ArithmeticProblem) -> ProblemGroupBuilder:
        def make_env() -> ProblemEnv:
            return AdditionEnv(
                problem,
                self.renderer,
                convo_prefix=self.convo_prefix,
                format_coef=self.format_coef,
                worked=self.worked,
            )

        return ProblemGroupBuilder(
            env_thunk=make_env, num_envs=self.group_size, dataset_name="addition"
        )
