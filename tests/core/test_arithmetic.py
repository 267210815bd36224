"""Tests of `rlpure.tasks.arithmetic`: problem space, split, grading, and the noisy corpus."""

from __future__ import annotations

import doctest

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpure.tasks import arithmetic as ar
from rlpure.tasks.arithmetic import ArithmeticProblem, check_problem_batches

# --- problems ----------------------------------------------------------------------------------


def test_all_problems_enumerates_every_pair_in_index_order() -> None:
    problems = ar.all_problems(max_operand=3)
    assert len(problems) == 16
    assert [(p.a, p.b) for p in problems[:5]] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]
    assert len(set(problems)) == 16


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_all_problems_rejects_bad_max_operand(bad: object) -> None:
    with pytest.raises(ValueError, match="max_operand"):
        ar.all_problems(max_operand=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("a", "b"), [(-1, 0), (0, -3), (True, 1)])
def test_problem_rejects_negative_or_bool_operands(a: object, b: object) -> None:
    with pytest.raises(ValueError, match=r"ArithmeticProblem\.[ab]"):
        ArithmeticProblem(a=a, b=b)  # type: ignore[arg-type]


def test_question_and_answer() -> None:
    problem = ArithmeticProblem(a=7, b=9)
    assert ar.problem_question(problem) == "7+9"
    assert problem.answer == 16


# --- split -------------------------------------------------------------------------------------


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), max_operand=st.integers(1, 6), data=st.data())
def test_split_is_a_partition_and_deterministic(seed: int, max_operand: int, data: st.DataObject):
    total = (max_operand + 1) ** 2
    num_test = data.draw(st.integers(1, total - 1))
    split = ar.split_problems(jax.random.key(seed), max_operand=max_operand, num_test=num_test)
    assert len(split.test) == num_test
    assert len(split.train) == total - num_test
    assert not set(split.train) & set(split.test)
    assert set(split.train) | set(split.test) == set(ar.all_problems(max_operand=max_operand))
    again = ar.split_problems(jax.random.key(seed), max_operand=max_operand, num_test=num_test)
    assert again == split


def test_split_depends_on_key() -> None:
    splits = {
        ar.split_problems(jax.random.key(seed), max_operand=9, num_test=20).test
        for seed in range(4)
    }
    assert len(splits) == 4


@pytest.mark.parametrize("num_test", [0, 100, 101])
def test_split_rejects_empty_halves(num_test: int) -> None:
    with pytest.raises(ValueError, match=r"num_test must be in \[1, 99\]"):
        ar.split_problems(jax.random.key(0), max_operand=9, num_test=num_test)


# --- grading -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8", 8),
        ("13", 13),
        ("0", 0),
        ("-2", -2),
        ("=8", 8),
        ("=0", 0),
        ("=-1", -1),  # well formed (and wrong)
        ("08", None),  # superfluous leading zero
        ("=08", None),
        ("==8", None),
        ("= 8", None),
        ("8=", None),
        ("3+5=8", None),
        ("-0", None),
        (" 8", None),  # the renderer already removed the one rendered space
        ("8\n", None),  # a trailing newline is a format drift, not an answer
        ("3 + 5 = 8", None),
        ("=", None),
        ("3+5", None),
        ("-=2", None),
        ("8.", None),
        ("8.0", None),
        ("+8", None),
        ("1 3", None),
        ("eight", None),
        ("", None),
        ("\u0663", None),  # non-ASCII digits are not decimal digits here
    ],
)
def test_parse_answer_is_strict(text: str, expected: int | None) -> None:
    assert ar.parse_answer(text) == expected
    assert ar.check_answer_format(text) == (expected is not None)


def test_grade_response() -> None:
    problem = ArithmeticProblem(a=9, b=9)
    assert ar.grade_response("18", problem)
    assert ar.grade_response("=18", problem)
    assert not ar.grade_response("=19", problem)
    assert not ar.grade_response("9+9=18", problem)
    assert not ar.grade_response("19", problem)
    assert not ar.grade_response("018", problem)
    assert not ar.grade_response("18\n", problem)
    assert not ar.grade_response("", problem)


@settings(max_examples=60, deadline=None)
@given(a=st.integers(0, 10**6), b=st.integers(0, 10**6))
def test_right_answers_grade_correct_in_both_forms(a: int, b: int) -> None:
    problem = ArithmeticProblem(a=a, b=b)
    assert ar.grade_response(str(a + b), problem)
    assert ar.grade_response(ar.careful_response(problem), problem)
    assert not ar.grade_response(str(a + b + 1), problem)


# --- the noisy corpus ---------------------------------------------------------------------------


def _offsets(responses: list[str], problems: tuple[ArithmeticProblem, ...]) -> list[object]:
    """`"careful"` for a careful response, else the guess minus the sum."""
    out: list[object] = []
    for response, problem in zip(responses, problems, strict=True):
        if "=" in response:
            assert response == ar.careful_response(problem)
            out.append("careful")
        else:
            answer = ar.parse_answer(response)
            assert answer is not None, response
            out.append(answer - problem.answer)
    return out


def test_corpus_is_deterministic_by_key() -> None:
    problems = ar.all_problems(max_operand=9)
    one = ar.corpus_responses(jax.random.key(3), problems)
    assert ar.corpus_responses(jax.random.key(3), problems) == one
    assert ar.corpus_responses(jax.random.key(4), problems) != one


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    p_correct=st.floats(0.0, 1.0),
    share_high=st.floats(0.0, 1.0),
)
def test_corpus_is_well_formed_careful_or_near_miss(
    seed: int, p_correct: float, share_high: float
) -> None:
    p_high = (1.0 - p_correct) * share_high
    problems = ar.all_problems(max_operand=4)
    responses = ar.corpus_responses(
        jax.random.key(seed), problems, p_correct=p_correct, p_high=p_high
    )
    assert all(ar.check_answer_format(r) for r in responses)
    offsets = _offsets(responses, problems)
    assert set(offsets) <= {"careful", -1, 1, 2}
    for offset, problem in zip(offsets, problems, strict=True):
        if offset in (-1, 2):  # sum - 1, or sum + 2 when the sum is 0 (never negative)
            assert (offset == 2) == (problem.answer == 0)
    # only the careful style is right
    for response, problem in zip(responses, problems, strict=True):
        assert ar.grade_response(response, problem) == ("=" in response)


def test_corpus_frequencies_match_the_probabilities() -> None:
    problems = ar.all_problems(max_operand=9) * 40  # 4000 documents
    offsets = np.array(
        [
            str(o)
            for o in _offsets(
                ar.corpus_responses(jax.random.key(0), problems, p_correct=0.3, p_high=0.45),
                problems,
            )
        ]
    )
    assert abs(np.mean(offsets == "careful") - 0.3) < 0.03
    assert abs(np.mean(offsets == "1") - 0.45) < 0.03
    assert abs(np.mean((offsets == "-1") | (offsets == "2")) - 0.25) < 0.03


def test_corpus_extremes() -> None:
    problems = ar.all_problems(max_operand=5)
    right = ar.corpus_responses(jax.random.key(1), problems, p_correct=1.0, p_high=0.0)
    assert right == [ar.careful_response(p) for p in problems]
    high = ar.corpus_responses(jax.random.key(1), problems, p_correct=0.0, p_high=1.0)
    assert high == [str(p.answer + 1) for p in problems]


@pytest.mark.parametrize(("p_correct", "p_high"), [(-0.1, 0.2), (0.5, 0.6), (1.2, 0.0)])
def test_corpus_rejects_bad_probabilities(p_correct: float, p_high: float) -> None:
    with pytest.raises(ValueError, match="p_correct"):
        ar.corpus_responses(
            jax.random.key(0), ar.all_problems(max_operand=2), p_correct=p_correct, p_high=p_high
        )


def test_doctests() -> None:
    result = doctest.testmod(ar)
    assert result.attempted > 0
    assert result.failed == 0


def test_problem_batches_are_checked_naming_the_dataset() -> None:
    check_problem_batches("D", 5, 5)
    with pytest.raises(ValueError, match=r"^D\.problems: empty$"):
        check_problem_batches("D", 0, 1)
    for groups in (0, 6):
        with pytest.raises(
            ValueError, match=rf"^D\.groups_per_batch: expected in \[1, 5\], got {groups}$"
        ):
            check_problem_batches("D", 5, groups)
