"""Addition answered worked: the question written out with its result, `"3+5=8"`.

The grammar of `rlpure demo`'s SmolLM2 task (`shell.jobs.smollm2`), on the problems of
`rlpure.tasks.arithmetic` (`a + b`, question text `"{a}+{b}"`). The only well-formed response
is the *worked* answer: the question's own text, then `=` and the integer as
`rlpure.tasks.arithmetic.parse_answer` reads it (`"3+5=8"` for the question `"3+5"`). The
operands must be the question's, in its order, with no spaces; a bare answer (`"8"`), a worked
answer to another question (`"5+3=8"`) or one with spaces (`"3 + 5 = 8"`) is malformed.

A response is correct only if it is well formed and its integer is the sum. The grammar is
strict on purpose: a reward that accepted "any text whose last number is the sum" would be
gamed by listing numbers, and a strict one makes the held-out accuracy mean what it says.
"""

from __future__ import annotations

from rlpure.tasks.arithmetic import ArithmeticProblem, parse_answer, problem_question

__all__ = [
    "check_worked_format",
    "grade_worked_response",
    "parse_worked_answer",
    "worked_response",
]


def parse_worked_answer(response: str, problem: ArithmeticProblem) -> int | None:
    """The integer `response` states as a worked answer to `problem`, or None if it is malformed.

    Examples:
        >>> p = ArithmeticProblem(a=3, b=5)
        >>> parse_worked_answer("3+5=8", p), parse_worked_answer("3+5=9", p)
        (8, 9)
        >>> parse_worked_answer("8", p), parse_worked_answer("=8", p)
        (None, None)
        >>> parse_worked_answer("5+3=8", p), parse_worked_answer("3 + 5 = 8", p)
        (None, None)
        >>> parse_worked_answer("3+5=8.", p), parse_worked_answer("3+5==8", p)
        (None, None)
    """
    prefix = problem_question(problem) + "="
    result = response[len(prefix) :]
    if not response.startswith(prefix) or result.startswith("="):
        return None
    return parse_answer(result)


def check_worked_format(response: str, problem: ArithmeticProblem) -> bool:
    """Whether `response` is a well-formed answer to `problem` (see `parse_worked_answer`)."""
    return parse_worked_answer(response, problem) is not None


def grade_worked_response(response: str, problem: ArithmeticProblem) -> bool:
    """Whether `response` is well formed and states the problem's sum.

    Examples:
        >>> p = ArithmeticProblem(a=3, b=5)
        >>> grade_worked_response("3+5=8", p), grade_worked_response("8", p)
        (True, False)
        >>> grade_worked_response("3+5=9", p), grade_worked_response("3+5=8\\n", p)
        (False, False)
    """
    return parse_worked_answer(response, problem) == problem.answer


def worked_response(problem: ArithmeticProblem) -> str:
    """The worked answer of `problem`, e.g. `"3+5=8"`."""
    return f"{problem_question(problem)}={problem.answer}"
