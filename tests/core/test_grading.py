"""Tests of `rlpure.tasks.math_grading`: real GSM8K files, explicit edge cases, properties, differential."""

from __future__ import annotations

import json
import re
import time
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rlpure.tasks.math_grading import (
    GSM8K_QUESTION_SUFFIX,
    extract_boxed,
    grade_answer,
    grade_boxed_response,
    gsm8k_fewshot_prefix,
    gsm8k_ground_truth,
    gsm8k_question,
    has_boxed_answer,
    normalize_numeric_answer,
)

GSM8K_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"
MODEL_COLUMNS = ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification")


def _read_jsonl(name: str) -> list[dict]:
    path = GSM8K_DIR / name
    if not path.is_file():
        pytest.skip(f"GSM8K data file {path} is absent (expected ../shared/data/gsm8k/)")
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# --- the real data -----------------------------------------------------------------------------


@pytest.mark.parametrize(("split", "rows"), [("train", 7473), ("test", 1319)])
def test_every_gsm8k_answer_yields_an_integer(split: str, rows: int) -> None:
    data = _read_jsonl(f"{split}.jsonl")
    assert len(data) == rows
    for i, row in enumerate(data):
        truth = gsm8k_ground_truth(row["answer"])
        # Slow obvious reference: the last line starts with "####".
        last_line = row["answer"].strip().splitlines()[-1]
        assert last_line.startswith("####"), (split, i)
        assert truth == last_line[4:].replace(",", "").strip(), (split, i)
        value = normalize_numeric_answer(truth)
        assert value is not None, (split, i, truth)
        assert value.denominator == 1, (split, i, truth)
        assert grade_answer(truth, truth)
        assert grade_boxed_response(f"So the answer is \\boxed{{{truth}}}.", truth)
        assert not grade_boxed_response(f"\\boxed{{{value + 1}}}", truth)


def _final_a_line(text: str) -> re.Match[str] | None:
    return re.search(r"A: (.*)\s*$", text)


def test_differential_against_gsm8k_model_solution_labels() -> None:
    """Real model solutions end in `A: <number>`; boxing that number must grade as labelled."""
    data = _read_jsonl("example_model_solutions.jsonl")
    agree = total = truncated = 0
    disagreements = []
    for i, row in enumerate(data):
        truth_match = _final_a_line(row["ground_truth"])
        assert truth_match is not None, i
        truth = truth_match.group(1)
        for column in MODEL_COLUMNS:
            solution = row[column]["solution"]
            label = row[column]["is_correct"]
            match = _final_a_line(solution)
            if match is None:
                truncated += 1
                response = solution  # no final answer, so no box
            else:
                response = f"{solution[: match.start()]}\\boxed{{{match.group(1)}}}"
            graded = grade_boxed_response(response, truth)
            total += 1
            agree += graded == label
            if graded != label:
                disagreements.append((i, column, truth, match and match.group(1), label))
    print(
        f"\ngrade_answer vs is_correct labels: {agree}/{total} = {agree / total:.4%} agree "
        f"({truncated} truncated solutions)"
    )
    assert total == 4 * 1319
    assert disagreements == []


def test_differential_survives_reformatting_the_model_answer() -> None:
    """Same labels after writing each numeric model answer as `$1,234.00`."""
    data = _read_jsonl("example_model_solutions.jsonl")
    checked = 0
    for row in data[:400]:
        truth = _final_a_line(row["ground_truth"]).group(1)  # type: ignore[union-attr]
        for column in MODEL_COLUMNS:
            match = _final_a_line(row[column]["solution"])
            if match is None or not re.fullmatch(r"-?\d+", match.group(1)):
                continue
            number = int(match.group(1))
            sign = "-" if number < 0 else ""
            fancy = f"{sign}\\${abs(number):,}.00"
            assert grade_answer(fancy, truth) == row[column]["is_correct"], (fancy, truth)
            checked += 1
    assert checked > 1000


# --- explicit edge cases -----------------------------------------------------------------------

EXTRACT_CASES = [
    (r"The answer is \boxed{42}.", "42"),
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # nested braces (the tutorial regex gives "\frac{1")
    (r"\boxed{\text{\textbf{7}}} apples", r"\text{\textbf{7}}"),
    (r"first \boxed{1}, then \boxed{2}, finally \boxed{3}", "3"),  # last wins
    (r"\boxed{ 18 }", "18"),
    (r"\boxed{}", ""),  # empty box: an answer, never correct
    (r"\boxed {5}", "5"),  # whitespace before the brace is still a box
    (r"\boxed\n{5}", "5"),
    (r"\boxed{\boxed{3}}", "3"),  # the last \boxed is the inner one
    (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces do not group
    ("no box at all", None),
    ("", None),
    (r"\boxed{3} and then \boxed{4", None),  # last box unbalanced (truncated): no answer
    (r"\boxed{", None),
    # without braces (the cookbook's fallback, only when there is no `\boxed{` at all)
    (r"\boxed 5", "5"),
    (r"so \boxed 42.", "42"),
    (r"\boxed\n7", "7"),
    (r"\boxed x", "x"),
    (r"\boxed 1, no: \boxed 2", "2"),  # the last wins (the cookbook takes the first)
    (r"\boxed{3} then \boxed 4", "3"),  # a braced box wins wherever it is
    (r"\boxed 4 then \boxed{3}", "3"),
    (r"\boxed 7 then \boxed{8", None),  # the last braced box is truncated: no answer
    (r"\boxed 3.5", "3"),  # letters and digits only, as the cookbook's pattern
    (r"\boxed -7", None),
    (r"\boxed7", None),
    (r"\boxed", None),
    (r"\boxedx{5}", None),
    (r"\fbox{5}", None),
    (r"boxed{5}", None),
    ("}}}{{{", None),
]


@pytest.mark.parametrize(("text", "expected"), EXTRACT_CASES)
def test_extract_boxed_cases(text: str, expected: str | None) -> None:
    text = text.replace("\\n", "\n")
    assert extract_boxed(text) == expected
    assert has_boxed_answer(text) == (expected is not None)


NUMBER_CASES = [
    ("18", Fraction(18)),
    ("18.00", Fraction(18)),
    ("18.0", Fraction(18)),
    ("18.", Fraction(18)),
    ("+18", Fraction(18)),
    ("$18", Fraction(18)),
    (r"\$18", Fraction(18)),
    ("$18$", Fraction(18)),
    ("18 dollars", Fraction(18)),
    ("18 dollars.", Fraction(18)),
    ("5 square feet", Fraction(5)),
    (r"18 \text{ dollars}", Fraction(18)),
    (r"\text{18}", Fraction(18)),
    ("20%", Fraction(20)),  # percent is dropped, not divided: GSM8K writes percents bare
    (r"20\%", Fraction(20)),
    ("20% off", Fraction(20)),
    ("20 percent", Fraction(20)),
    (r"90^\circ", Fraction(90)),
    (r"90^{\circ}", Fraction(90)),
    ("1,000", Fraction(1000)),
    ("1,234,567.5", Fraction(2469135, 2)),
    ("1{,}000", Fraction(1000)),
    (r"1\,000", Fraction(1000)),
    ("-5", Fraction(-5)),
    ("\u22125", Fraction(-5)),  # unicode minus
    ("- 5", Fraction(-5)),
    ("$-5", Fraction(-5)),
    (r"-\$5", Fraction(-5)),
    ("-0.25", Fraction(-1, 4)),
    (".5", Fraction(1, 2)),
    ("0.1", Fraction(1, 10)),  # exact: 0.1 is not the float 0.1000000000000000055...
    ("1/2", Fraction(1, 2)),
    ("-3/4", Fraction(-3, 4)),
    (r"\frac{1}{2}", Fraction(1, 2)),
    (r"\dfrac{6}{4}", Fraction(3, 2)),
    (r"-\tfrac{3}{4}", Fraction(-3, 4)),
    ("", None),
    (" ", None),
    ("five", None),
    ("abc", None),
    ("1,5", None),  # misplaced thousands separator
    ("3, 8", None),
    ("1,0000", None),
    ("1 1/2", None),  # mixed numbers are ambiguous
    ("1/0", None),
    (r"\frac{1}{0}", None),
    (r"\frac12", None),
    ("1e3", None),
    ("3+4", None),
    ("x = 5", None),
    ("18 or 20", None),
    ("5 very big square feet", None),  # at most three unit words
    ("--5", None),
    ("__import__('os')", None),
    ("nan", None),
    ("inf", None),
]


@pytest.mark.parametrize(("text", "expected"), NUMBER_CASES)
def test_normalize_numeric_answer_cases(text: str, expected: Fraction | None) -> None:
    assert normalize_numeric_answer(text) == expected


GRADE_CASES = [
    (r"\boxed{1,000}", "1000", True),
    (r"\boxed{18.00}", "18", True),
    (r"\boxed{\$18}", "18", True),
    (r"\boxed{18 dollars}", "18", True),
    (r"\boxed{-3}", "-3", True),
    (r"\boxed{3}", "-3", False),
    (r"\boxed{\frac{1}{2}}", "0.5", True),
    (r"\boxed{0.5}", "1/2", True),
    (r"\boxed{17}", "18", False),
    (r"\boxed{18.01}", "18", False),
    (r"\boxed{180}", "18", False),
    (r"\boxed{1.8}", "18", False),
    (r"\boxed{}", "18", False),
    ("18", "18", False),  # no box
    (r"\boxed{18", "18", False),  # unclosed box
    (r"The answer is \boxed 18.", "18", True),  # unbraced, as the cookbook grades it
    (r"\boxed 17", "18", False),
    (r"\boxed{18} no wait \boxed{19}", "18", False),  # last box wins
    (r"\boxed{19} no wait \boxed{18}", "18", True),
    (r"\boxed{garbage}", "18", False),
    (r"\boxed{18}", "garbage", False),
    (r"\boxed{garbage}", "garbage", False),  # non-numeric never grades correct
]


@pytest.mark.parametrize(("response", "truth", "expected"), GRADE_CASES)
def test_grade_boxed_response_cases(response: str, truth: str, expected: bool) -> None:
    assert grade_boxed_response(response, truth) is expected


ADVERSARIAL = {
    "letters then digit": "a" * 20_000 + "1",  # 18 s at 250 chars with a backtracking regex
    "words": "a " * 10_000 + "1",
    "unit words": "1 " + "x " * 10_000,
    "commas": "1," * 10_000,
    "open braces": "{" * 20_000,
    "open boxes": "\\boxed{" * 3_000,
    "spaced box": "\\boxed" + " " * 20_000,
    "unbraced boxes": "\\boxed " * 5_000 + "\\boxed" + " " * 20_000,
    "huge fraction": "1" * 20_000 + "/" + "1" * 20_000,
    "huge number": "9" * 20_000,  # int() refuses > 4300 digits: must be None, not an error
    "text wrappers": "\\text{" * 3_000,
    "spaces": " " * 20_000 + "x1",
    "minus signs": "-" * 20_000 + "5",
}


@pytest.mark.parametrize("text", ADVERSARIAL.values(), ids=ADVERSARIAL.keys())
def test_adversarial_inputs_are_fast_and_safe(text: str) -> None:
    start = time.perf_counter()
    value = normalize_numeric_answer(text)
    boxed = extract_boxed(text)
    graded = grade_boxed_response(text, "1")
    elapsed = time.perf_counter() - start
    assert value is None or isinstance(value, Fraction)
    assert boxed is None or isinstance(boxed, str)
    assert graded is False
    assert elapsed < 2.0, f"{elapsed:.2f} s"  # ~0.05 s measured; generous for a shared CPU


def test_grade_answer_none_is_wrong() -> None:
    assert grade_answer(None, "18") is False


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72", "72"),
        ("#### 1,000", "1000"),
        ("#### -5", "-5"),
        ("a #### 3\nb\n#### 4 ", "4"),  # last marker wins
        ("#### 12,345,678", "12345678"),
    ],
)
def test_gsm8k_ground_truth_cases(answer: str, expected: str) -> None:
    assert gsm8k_ground_truth(answer) == expected


@pytest.mark.parametrize("answer", ["no marker here", "", "### 5", "#### ", "#### ,"])
def test_gsm8k_ground_truth_refuses_rows_without_an_answer(answer: str) -> None:
    with pytest.raises(ValueError, match="gsm8k_ground_truth"):
        gsm8k_ground_truth(answer)


def test_type_errors_name_the_function() -> None:
    with pytest.raises(TypeError, match="extract_boxed"):
        extract_boxed(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="gsm8k_ground_truth"):
        gsm8k_ground_truth(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="normalize_numeric_answer"):
        normalize_numeric_answer(1.5)  # type: ignore[arg-type]


def test_gsm8k_prompt_data_is_the_tutorials() -> None:
    assert GSM8K_QUESTION_SUFFIX == (
        " Provide a numerical answer without units, written inside \\boxed{}."
    )
    assert gsm8k_question("How many?") == "How many?" + GSM8K_QUESTION_SUFFIX
    prefix = gsm8k_fewshot_prefix()
    assert [m["role"] for m in prefix] == ["user", "assistant"]
    assert prefix[0]["content"] == "How many r's are in strawberry?" + GSM8K_QUESTION_SUFFIX
    assert prefix[1]["content"].startswith("Let's spell the word out and number all the letters")
    assert grade_boxed_response(prefix[1]["content"], "3")
    prefix[0]["content"] = "mutated"
    assert gsm8k_fewshot_prefix()[0]["content"] != "mutated"  # a fresh list each call


# --- properties --------------------------------------------------------------------------------

# Values with at most two decimals, as money and GSM8K answers are written.
cents = st.integers(min_value=-(10**9), max_value=10**9)


def _exact_decimal(value: Fraction) -> str:
    """The plain decimal text of a value with at most two decimals, by integer arithmetic."""
    cents = value * 100
    assert cents.denominator == 1
    sign = "-" if cents < 0 else ""
    whole, rest = divmod(abs(cents.numerator), 100)
    return f"{sign}{whole}" if rest == 0 else f"{sign}{whole}.{rest:02d}"


def _fancy(
    value: Fraction, *, commas: bool, dollar: str, zeros: int, plus: bool, suffix: str
) -> str:
    magnitude = abs(value)
    whole = int(magnitude)
    frac_cents = int((magnitude - whole) * 100)
    whole_text = f"{whole:,}" if commas else str(whole)
    decimals = f".{frac_cents:02d}" if frac_cents else "." + "0" * zeros if zeros else ""
    sign = "-" if value < 0 else ("+" if plus else "")
    return f"{sign}{dollar}{whole_text}{decimals}{suffix}"


@settings(max_examples=300, deadline=None)
@given(
    cents=cents,
    commas=st.booleans(),
    dollar=st.sampled_from(["", "$", "\\$"]),
    zeros=st.integers(0, 3),
    plus=st.booleans(),
    suffix=st.sampled_from(["", "%", "\\%", " dollars", " cm", " square feet", " apples."]),
    wrap=st.sampled_from(["{}", "\\text{{{}}}", "$ {} $", " {} "]),
)
@example(cents=100_000, commas=True, dollar="", zeros=0, plus=False, suffix="", wrap="{}")
def test_formatting_a_number_grades_equal(
    cents: int, commas: bool, dollar: str, zeros: int, plus: bool, suffix: str, wrap: str
) -> None:
    value = Fraction(cents, 100)
    text = wrap.format(
        _fancy(value, commas=commas, dollar=dollar, zeros=zeros, plus=plus, suffix=suffix)
    )
    assert normalize_numeric_answer(text) == value, text
    truth = _exact_decimal(value)
    assert grade_boxed_response(f"Thus \\boxed{{{text}}}", truth), (text, truth)


@settings(max_examples=200, deadline=None)
@given(a=cents, b=cents | st.just(0), commas=st.booleans(), zeros=st.integers(0, 2))
def test_grading_is_numeric_equality(a: int, b: int, commas: bool, zeros: int) -> None:
    x, y = Fraction(a, 100), Fraction(b, 100)
    given_text = _fancy(x, commas=commas, dollar="$", zeros=zeros, plus=False, suffix="")
    assert grade_answer(given_text, _exact_decimal(y)) == (x == y)
    assert grade_answer(_exact_decimal(y), given_text) == (x == y)  # symmetric on numbers


@settings(max_examples=200, deadline=None)
@given(numerator=st.integers(-1000, 1000), denominator=st.integers(1, 1000))
def test_fractions_compare_exactly(numerator: int, denominator: int) -> None:
    value = Fraction(numerator, denominator)
    sign = "-" if numerator < 0 else ""
    texts = (
        f"{numerator}/{denominator}",
        f"{sign}\\frac{{{abs(numerator)}}}{{{denominator}}}",
        f"{sign}\\dfrac{{{abs(numerator)}}}{{{denominator}}}",
    )
    for text in texts:
        assert normalize_numeric_answer(text) == value, text
        assert grade_answer(text, f"{value.numerator}/{value.denominator}"), text
    if (value * 100).denominator == 1:  # representable as a two-decimal number
        assert grade_answer(texts[1], _exact_decimal(value))


def _balanced(max_leaves: int = 6) -> st.SearchStrategy[str]:
    """Strings whose unescaped braces are balanced, and which contain no `\\boxed`."""
    leaf = st.text(alphabet="0123456789 abcxyz.,$+-/%\\", max_size=5).filter(
        lambda s: not s.endswith("\\") and "\\boxed" not in s
    )
    return st.recursive(
        leaf,
        lambda inner: st.builds(lambda a, b, c: f"{a}{{{b}}}{c}", inner, inner, inner),
        max_leaves=max_leaves,
    )


no_box_text = st.text(max_size=40).filter(lambda s: "boxed" not in s)


@settings(max_examples=300, deadline=None)
@given(before=st.text(max_size=40), content=_balanced(), after=no_box_text)
def test_extract_boxed_returns_the_last_box_content(before: str, content: str, after: str) -> None:
    text = f"{before}\\boxed{{{content}}}{after}"
    assert extract_boxed(text) == content.strip()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_arbitrary_text_never_raises(text: str) -> None:
    boxed = extract_boxed(text)
    assert boxed is None or isinstance(boxed, str)
    value = normalize_numeric_answer(text)
    assert value is None or isinstance(value, Fraction)
    assert isinstance(grade_boxed_response(text, "18"), bool)
