"""The demo's arithmetic task as envs and datasets, on top of the shared `ProblemEnv` glue.

Part of `rlpure demo` (see `shell.jobs.demo`). `ArithmeticEnv` asks one `a + b` question
(`rlpure.tasks.arithmetic`) through a renderer and grades the answer strictly; `ArithmeticDataset`
serves batches of `groups_per_batch` distinct problems, each a group of `group_size` envs
(`ProblemGroupBuilder`, dataset name `"arithmetic"`). Batch `i` draws its problems with
`fold_in(key, i)`, so batches are reproducible and independent of how many were read before;
`key=None` gives one batch of every problem in order, for evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax

from rlpure.render import Renderer
from rlpure.tasks import arithmetic
from rlpure.tasks.arithmetic import ArithmeticProblem, batch_problem_indices, check_problem_batches
from shell.env import EnvGroupBuilder, ProblemEnv, ProblemGroupBuilder, RLDataset

__all__ = ["ArithmeticDataset", "ArithmeticEnv", "batch_problem_indices"]


class ArithmeticEnv(ProblemEnv):
    """One `a + b` question; correct iff the answer is exactly the sum (strict format)."""

    def __init__(
        self, problem: ArithmeticProblem, renderer: Renderer, *, format_coef: float = 0.1
    ) -> None:
        super().__init__(renderer, format_coef=format_coef)
        self.problem = problem

    def get_question(self) -> str:
        return arithmetic.problem_question(self.problem)

    def check_answer(self, sample_str: str) -> bool:
        return arithmetic.grade_response(sample_str, self.problem)

    def check_format(self, sample_str: str) -> bool:
        return arithmetic.check_answer_format(sample_str)

    def get_reference_answer(self) -> str:
        return str(self.problem.answer)


def _group_builder(
    problem: ArithmeticProblem, renderer: Renderer, *, group_size: int, format_coef: float
) -> ProblemGroupBuilder:
    def make_env() -> ProblemEnv:
        return ArithmeticEnv(problem, renderer, format_coef=format_coef)

    return ProblemGroupBuilder(env_thunk=make_env, num_envs=group_size, dataset_name="arithmetic")


class ArithmeticDataset(RLDataset):
    """Batches of arithmetic problems: batch `i` draws `groups_per_batch` distinct problems.

    With `key=None` the dataset is one batch holding every problem in order (for evaluation).

    Args:
        problems: the problems to draw from.
        renderer: the prompt renderer.
        num_batches: number of batches (`len`).
        groups_per_batch: problems per batch (at most `len(problems)`).
        group_size: envs per problem.
        key: JAX key; batch `i` uses `fold_in(key, i)` (None: evaluation order, one batch).
        format_coef: reward penalty of a malformed answer.
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
        format_coef: float = 0.1,
    ) -> None:
        check_problem_batches("ArithmeticDataset", len(problems), groups_per_batch)
        self.problems = tuple(problems)
        self.renderer = renderer
        self.num_batches = num_batches
        self.groups_per_batch = groups_per_batch
        self.group_size = group_size
        self.key = key
        self.format_coef = format_coef

    def __len__(self) -> int:
        return self.num_batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < self.num_batches:
            raise IndexError(f"ArithmeticDataset.get_batch: index {index} not in [0, {len(self)})")
        chosen = batch_problem_indices(self.key, index, len(self.problems), self.groups_per_batch)
        return [
            _group_builder(
                self.problems[i],
                self.renderer,
                group_size=self.group_size,
                format_coef=self.format_coef,
            )
            for i in chosen
        ]
