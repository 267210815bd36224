"""Procedural arithmetic problems for the offline GRPO demo: generation, grading, a noisy corpus.

Conventions:
- A problem is `a + b` with integer operands in `[0, max_operand]` (`ArithmeticProblem`); the
  problem space of a `max_operand` is the `(max_operand + 1)²` ordered pairs, indexed
  `i = a · (max_operand + 1) + b`. Arrays over problems carry the suffix `_P` (STYLE's letter for
  problems).
- The question text is `"{a}+{b}"` (short: the byte tokenizer spends a token per character).
  A well-formed response is a bare integer (`"8"`) or the result completing the question's
  equation (`"=8"`); its answer is that integer (`parse_answer`). Parsing is strict: decimal
  ASCII digits without superfluous leading zeros, no spaces, nothing before or after; anything
  else (`"8."`, `"08"`, `"8\\n"`, `"eight"`, `""`) is not an answer and is never correct.
  Both forms are short on purpose: the prompt and answer of every problem with
  `max_operand <= 9` fit in 32 tokens, one shape bucket of the local backend (half the
  training cost of the next bucket, 64).
- Randomness comes only from explicit JAX keys; the same key gives the same split and corpus
  on every machine. Results are host-side Python / numpy values (this is data generation, not
  traced maths).
- The "base model" corpus (`corpus_responses`) has the right format everywhere but is right
  only with probability `p_correct`: a careful writer completes the equation (`"=8"`, always
  right); otherwise a hasty one guesses a near miss (`"9"` = sum + 1 with probability
  `p_high`, else sum − 1). With the defaults (0.3, 0.7) a model fitted to the corpus answers
  wrongly under greedy decoding, yet samples a right, careful answer about 30% of the time:
  an exploration problem that GRPO solves by reinforcing the careful style.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import jax
import msgspec
import numpy as np

__all__ = [
    "ArithmeticProblem",
    "ProblemSplit",
    "all_problems",
    "batch_problem_indices",
    "careful_response",
    "check_answer_format",
    "check_problem_batches",
    "corpus_responses",
    "grade_response",
    "parse_answer",
    "problem_question",
    "split_problems",
]

_NATURAL = r"(?:0|[1-9][0-9]*)"
_ANSWER_RE = re.compile(rf"=?(?P<n>-?{_NATURAL})")


class ArithmeticProblem(msgspec.Struct, frozen=True, kw_only=True):
    """One problem `a + b`.

    Attributes:
        a: left operand (>= 0).
        b: right operand (>= 0).
    """

    a: int
    b: int

    def __post_init__(self) -> None:
        for name in ("a", "b"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"ArithmeticProblem.{name}: expected an int >= 0, got {value!r}")

    @property
    def answer(self) -> int:
        """The correct result `a + b`."""
        return self.a + self.b


class ProblemSplit(msgspec.Struct, frozen=True, kw_only=True):
    """Disjoint train and held-out test problems.

    Attributes:
        train: problems RL trains on (rewards are computed only on these).
        test: held-out problems, used only to measure accuracy.
    """

    train: tuple[ArithmeticProblem, ...]
    test: tuple[ArithmeticProblem, ...]


def _check_max_operand(max_operand: int) -> None:
    if isinstance(max_operand, bool) or not isinstance(max_operand, int) or max_operand < 1:
        raise ValueError(f"max_operand: expected an int >= 1, got {max_operand!r}")


def all_problems(*, max_operand: int) -> tuple[ArithmeticProblem, ...]:
    """Every problem `a + b` with `0 <= a, b <= max_operand`, in index order.

    Examples:
        >>> [(p.a, p.b) for p in all_problems(max_operand=1)]
        [(0, 0), (0, 1), (1, 0), (1, 1)]
    """
    _check_max_operand(max_operand)
    n = max_operand + 1
    return tuple(ArithmeticProblem(a=a, b=b) for a in range(n) for b in range(n))


def batch_problem_indices(
    key: jax.Array | None, index: int, num_problems: int, groups_per_batch: int
) -> list[int]:
    """The problems of batch `index`: the first `groups_per_batch` without a key, else a draw
    without replacement from `fold_in(key, index)` (the same batch for the same key and index,
    whatever was drawn before).

    Examples:
        >>> batch_problem_indices(None, 3, 10, 4)
        [0, 1, 2, 3]
        >>> key = jax.random.key(0)
        >>> batch_problem_indices(key, 1, 10, 4) == batch_problem_indices(key, 1, 10, 4)
        True
    """
    if key is None:
        return list(range(groups_per_batch))
    draw = jax.random.choice(
        jax.random.fold_in(key, index), num_problems, (groups_per_batch,), replace=False
    )
    return [int(i) for i in np.asarray(draw)]


def check_problem_batches(owner: str, num_problems: int, groups_per_batch: int) -> None:
    """Refuses a dataset of no problems, or batches of `groups_per_batch` problems that
    `batch_problem_indices` cannot draw from `num_problems` (the datasets' constructors).

    Raises:
        ValueError: naming `owner`'s field.

    Examples:
        >>> check_problem_batches("MyDataset", 3, 4)
        Traceback (most recent call last):
        ...
        ValueError: MyDataset.groups_per_batch: expected in [1, 3], got 4
    """
    if num_problems == 0:
        raise ValueError(f"{owner}.problems: empty")
    if not 1 <= groups_per_batch <= num_problems:
        raise ValueError(
            f"{owner}.groups_per_batch: expected in [1, {num_problems}], got {groups_per_batch}"
        )


def split_problems(key: jax.Array, *, max_operand: int, num_test: int) -> ProblemSplit:
    """Shuffles the problem space with `key` and holds out `num_test` problems for testing.

    Args:
        key: a JAX PRNG key.
        max_operand: the problem space (see `all_problems`).
        num_test: number of held-out problems, `1 <= num_test < (max_operand + 1)²`.

    Returns:
        The split; both halves in index order (so the split, not the order, depends on `key`).

    Raises:
        ValueError: if `num_test` leaves no problem for one of the halves.
    """
    problems = all_problems(max_operand=max_operand)
    if not 1 <= num_test < len(problems):
        raise ValueError(
            f"split_problems: num_test must be in [1, {len(problems) - 1}] for max_operand "
            f"{max_operand}, got {num_test}"
        )
    order_P = np.asarray(jax.random.permutation(key, len(problems)))
    test_index = set(order_P[:num_test].tolist())
    return ProblemSplit(
        train=tuple(p for i, p in enumerate(problems) if i not in test_index),
        test=tuple(p for i, p in enumerate(problems) if i in test_index),
    )


def problem_question(problem: ArithmeticProblem) -> str:
    """The question text, e.g. `"3+5"`."""
    return f"{problem.a}+{problem.b}"


def parse_answer(response: str) -> int | None:
    """The integer a response states, or None if the response is not a well-formed answer.

    Two forms are accepted, nothing else: a bare integer `"N"`, or the result completing the
    question's equation, `"=N"`. `N` is decimal ASCII without superfluous leading zeros and
    may carry a `-`.

    Examples:
        >>> parse_answer("13"), parse_answer("=13"), parse_answer("-2"), parse_answer("013")
        (13, 13, -2, None)
        >>> parse_answer(" 13"), parse_answer("13\\n"), parse_answer("= 13"), parse_answer("==13")
        (None, None, None, None)
    """
    match = _ANSWER_RE.fullmatch(response)
    if match is None or match.group("n") == "-0":
        return None
    return int(match.group("n"))


def check_answer_format(response: str) -> bool:
    """Whether `response` is a well-formed answer (see `parse_answer`)."""
    return parse_answer(response) is not None


def grade_response(response: str, problem: ArithmeticProblem) -> bool:
    """Whether `response` is well formed and its answer is the problem's sum.

    Examples:
        >>> p = ArithmeticProblem(a=3, b=5)
        >>> grade_response("8", p), grade_response("=8", p), grade_response("9", p)
        (True, True, False)
    """
    return parse_answer(response) == problem.answer


def careful_response(problem: ArithmeticProblem) -> str:
    """The careful, always-right corpus style: the question's equation completed, `"=8"`."""
    return f"={problem.answer}"


def corpus_responses(
    key: jax.Array,
    problems: Sequence[ArithmeticProblem],
    *,
    p_correct: float = 0.3,
    p_high: float = 0.7,
) -> list[str]:
    """The response the "base model" corpus writes for each problem (right only sometimes).

    For each problem independently, with `u ~ U[0, 1)` from `key`: if `u < p_correct`, the
    careful, right response `"=sum"` (`careful_response`); otherwise a hasty, wrong guess, the
    bare integer `sum + 1` if `u < p_correct + p_high`, else `sum − 1` (`sum + 2` when the sum
    is 0, so no answer is negative).

    Args:
        key: a JAX PRNG key.
        problems: the `N` problems to answer (repeats allowed).
        p_correct: probability of the careful, right response.
        p_high: probability of the guess `sum + 1`; `p_correct + p_high <= 1`.

    Returns:
        `N` response texts.

    Raises:
        ValueError: if the probabilities are outside `[0, 1]` or sum above 1.

    Examples:
        >>> two_plus_two = [ArithmeticProblem(a=2, b=2)]
        >>> corpus_responses(jax.random.key(0), two_plus_two, p_correct=1.0, p_high=0.0)
        ['=4']
        >>> corpus_responses(jax.random.key(0), two_plus_two, p_correct=0.0, p_high=1.0)
        ['5']
    """
    if not (0 <= p_correct <= 1 and 0 <= p_high <= 1 and p_correct + p_high <= 1 + 1e-12):
        raise ValueError(
            f"corpus_responses: need 0 <= p_correct, p_high and p_correct + p_high <= 1, "
            f"got p_correct={p_correct}, p_high={p_high}"
        )
    u_P = np.asarray(jax.random.uniform(key, (len(problems),)), np.float64)
    out = []
    for problem, u in zip(problems, u_P.tolist(), strict=True):
        total = problem.answer
        if u < p_correct:
            out.append(careful_response(problem))
        elif u < p_correct + p_high:
            out.append(str(total + 1))
        else:
            out.append(str(total - 1 if total > 0 else total + 2))
    return out
