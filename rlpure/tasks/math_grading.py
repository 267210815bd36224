"""Grading of numeric answers: GSM8K ground truths, `\\boxed{...}` extraction, exact comparison.

Conventions:
- A *response* is the model's full text; its *answer* is the content of the LAST
  `\\boxed{...}` in it (`extract_boxed`). The *ground truth* of a GSM8K row is the text after
  the last `####` of its `answer` field, commas removed (`gsm8k_ground_truth`).
- Answers are compared as exact rationals (`fractions.Fraction`), never as floats and never by
  evaluating model text: `normalize_numeric_answer` accepts a small, explicit grammar and
  returns None for anything else, and `grade_answer` is False unless both sides parse and are
  equal. So `18`, `18.00`, `+18`, `$18`, `\\$18`, `18 dollars`, `\\text{18}` are all 18, and
  `1,000` is 1000.

Decisions (each pinned by a test in `tests/test_grading.py`):
- `\\boxed {x}` (whitespace between `\\boxed` and the brace) counts as a box, since LaTeX reads
  it as one; `\\boxedx` and `\\fbox{x}` do not.
- Braces are matched with nesting, so `\\boxed{\\frac{1}{2}}` yields `\\frac{1}{2}`; escaped
  braces `\\{`/`\\}` do not count. If the last `\\boxed{` is never closed (a truncated
  response), there is no answer (None) — earlier boxes are not consulted, because the model's
  final answer is the unfinished one. For `\\boxed{\\boxed{3}}` the last `\\boxed` is the inner
  one, so the answer is `3`.
- `\\boxed{}` is an answer (the empty string): the format is right, the grade is False.
- A response with no `\\boxed{` at all may box its answer without braces, as TeX allows:
  `\\boxed 7` (whitespace, then a run of ASCII letters and digits) yields `7`, and `\\boxed 42`
  yields `42` (the cookbook's fallback in `math_rl/math_grading.py`; TeX itself would box only
  the `4`, but the answer meant is 42). The last such box counts, as for braced ones (the
  cookbook takes the first). `\\boxed7`, `\\boxed -7` and `\\boxed 3.5` (→ `3`) follow the
  cookbook's pattern; any `\\boxed{`, even unclosed, turns the fallback off.
- Thousands separators must be well placed (`1,000`, `12,345.5`); `1,5` or `3, 8` are not
  numbers (the GSM8K ground truth, which is trusted data, just has its commas deleted).
- A trailing `%` or up to three trailing unit words (`18 dollars`, `5 square feet`) are
  dropped, and so is `^\\circ`. `%` is NOT divided by 100: GSM8K writes the answer to "what
  percent" questions as the bare number (`20`), so `20%` must grade equal to `20`.
- Simple fractions are numbers: braced `\\frac{a}{b}` (also `\\dfrac`, `\\tfrac`) and `a/b`,
  with `a`, `b` decimals and `b != 0`; they compare exactly, so `1/2` equals `0.5` and
  `\\frac{2}{4}`. The unbraced `\\frac12` is not accepted.
  Mixed numbers (`1 1/2`), scientific notation, words (`five`) and expressions (`3+4`,
  `x = 5`) are not numbers; nor is anything longer than 1000 characters after cleaning.
- Every function runs in time linear (or near) in its input, whatever the model wrote: no
  backtracking-prone regex on model text (pinned by a timing test on adversarial inputs).
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = [
    "GSM8K_QUESTION_SUFFIX",
    "extract_boxed",
    "grade_answer",
    "grade_boxed_response",
    "gsm8k_fewshot_prefix",
    "gsm8k_ground_truth",
    "gsm8k_question",
    "has_boxed_answer",
    "normalize_numeric_answer",
]

_BOXED_OPEN = re.compile(r"\\boxed\s*\{")
_BOXED_UNBRACED = re.compile(r"\\boxed\s+([a-zA-Z0-9]+)")  # the cookbook's fallback
_GSM8K_MARKER = "####"

# An unsigned decimal: digits with well-placed thousands commas or plain digits, an optional
# fractional part (a bare trailing "." is allowed: "18." as at the end of a sentence), or ".5".
_UNSIGNED_DECIMAL = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+"
_DECIMAL_RE = re.compile(rf"(?P<sign>[+-]?)(?P<num>{_UNSIGNED_DECIMAL})")
_SLASH_FRACTION_RE = re.compile(
    rf"(?P<sign>[+-]?)(?P<num>{_UNSIGNED_DECIMAL})\s*/\s*(?P<den>{_UNSIGNED_DECIMAL})"
)
_LATEX_FRACTION_RE = re.compile(
    rf"(?P<sign>[+-]?)\\[dt]?frac\s*\{{\s*(?P<num>{_UNSIGNED_DECIMAL})\s*\}}"
    rf"\s*\{{\s*(?P<den>{_UNSIGNED_DECIMAL})\s*\}}"
)
_TEXT_WRAPPER_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_MAX_NUMBER_CHARS = 1000  # longer is no answer (and int() refuses > 4300 digits by default)
_UNIT_WORD_RE = re.compile(r"[A-Za-z]+\.?")
_MAX_UNIT_WORDS = 3
_DEGREES_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?")
_MINUS_SIGNS = ("\u2212", "\u2013", "\u2014")  # −, –, — written for a minus sign


def _matching_brace_end(text: str, open_index: int) -> int | None:
    """Index just past the `}` that closes the `{` at `open_index`, or None if unbalanced.

    Backslash-escaped braces (`\\{`, `\\}`) are literal characters, not grouping.
    """
    depth = 0
    i = open_index
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2  # skip the escaped character, whatever it is
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def extract_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` in `text`, nested braces matched.

    Args:
        text: a model response.

    Returns:
        The text between the braces of the last `\\boxed{` (whitespace stripped; may be empty),
        or None if the last one is never closed. Without any `\\boxed{`, the letters and digits
        of the last unbraced `\\boxed 7` (the cookbook's fallback), or None if there is none.

    Examples:
        >>> extract_boxed(r"so \\boxed{1} then \\boxed{\\frac{1}{2}}.")
        '\\\\frac{1}{2}'
        >>> extract_boxed("no box") is None
        True
        >>> extract_boxed(r"so \\boxed 7")
        '7'
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_boxed: text must be str, got {type(text).__name__}")
    last = None
    for last in _BOXED_OPEN.finditer(text):  # noqa: B007 - we want the last match
        pass
    if last is None:
        unbraced = _BOXED_UNBRACED.findall(text)
        return unbraced[-1] if unbraced else None
    open_index = last.end() - 1
    end = _matching_brace_end(text, open_index)
    if end is None:
        return None
    return text[open_index + 1 : end - 1].strip()


def has_boxed_answer(text: str) -> bool:
    """The GSM8K format check: `text` has an answer by `extract_boxed` (closed or unbraced)."""
    return extract_boxed(text) is not None


def gsm8k_ground_truth(answer_text: str) -> str:
    """The final answer of a GSM8K `answer` field: text after the last `####`, commas removed.

    Args:
        answer_text: the row's `answer`, a worked solution whose last line is `#### <number>`.

    Returns:
        The stripped final answer, e.g. `"1000"` for `"...\\n#### 1,000"`.

    Raises:
        ValueError: if there is no `####`, or nothing follows the last one.

    Examples:
        >>> gsm8k_ground_truth("48/2 = <<48/2=24>>24\\n#### 1,072")
        '1072'
    """
    if not isinstance(answer_text, str):
        raise TypeError(
            f"gsm8k_ground_truth: answer_text must be str, got {type(answer_text).__name__}"
        )
    head, marker, tail = answer_text.rpartition(_GSM8K_MARKER)
    if not marker:
        raise ValueError(
            f"gsm8k_ground_truth: no '{_GSM8K_MARKER}' in answer text {_preview(answer_text)}"
        )
    del head
    answer = tail.replace(",", "").strip()
    if not answer:
        raise ValueError(
            f"gsm8k_ground_truth: nothing after the last '{_GSM8K_MARKER}' in answer text "
            f"{_preview(answer_text)}"
        )
    return answer


def _preview(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else "..." + text[-limit:])


def _to_fraction(number: str) -> Fraction:
    """Exact value of a string matched by `_UNSIGNED_DECIMAL`."""
    digits = number.replace(",", "")
    if digits.endswith("."):
        digits = digits[:-1]
    return Fraction(digits)


def _strip_unit_words(text: str) -> str:
    """Drops up to `_MAX_UNIT_WORDS` whitespace-separated trailing words (`18 square feet`).

    Word by word on `str.split`, not one regex: a pattern like `(?:\\s*[A-Za-z]+){1,3}$` backtracks
    catastrophically on a long run of letters (seconds for 250 characters). A bare word, or
    more unit words than allowed, is left in place (and then fails to parse).
    """
    words = text.split()
    units = 0
    while (
        units <= _MAX_UNIT_WORDS
        and units < len(words) - 1
        and _UNIT_WORD_RE.fullmatch(words[-1 - units])
    ):
        units += 1
    if units == 0 or units > _MAX_UNIT_WORDS:
        return text
    return " ".join(words[:-units])


def _strip_decorations(text: str) -> str:
    """Removes the non-numeric wrapping a model puts around a number (see module docstring)."""
    text = text.strip()
    for _ in range(3):  # \text{\textbf{18}} unwraps in two passes
        text = _TEXT_WRAPPER_RE.sub(r"\1", text)
    for minus in _MINUS_SIGNS:
        text = text.replace(minus, "-")
    text = text.replace("{,}", ",")  # LaTeX thousands/decimal comma guard: 1{,}000
    text = _DEGREES_RE.sub("", text)
    for latex_space in ("\\!", "\\,", "\\;", "\\:", "\\ ", "~"):
        text = text.replace(latex_space, " " if latex_space == "\\ " else "")
    text = text.replace("\\$", "").replace("$", "")  # currency, or inline-math delimiters
    text = text.replace("\\%", "%").strip()
    text = _strip_unit_words(text)  # first, so "20% off" -> "20%" -> "20"
    text = text.removesuffix("%").strip()
    # A sign separated from the number ("- 5", "+ 5") is still its sign.
    text = re.sub(r"^([+-])\s+", r"\1", text)
    return text.strip()


def normalize_numeric_answer(text: str) -> Fraction | None:
    """The exact numeric value of an answer string, or None if it is not a plain number.

    Accepted (after `_strip_decorations`): a signed decimal with optional well-placed thousands
    commas (`-1,234.50`), a slash fraction of two decimals (`-3/4`), or a braced LaTeX
    fraction (`\\frac{3}{4}`, `-\\dfrac{3}{4}`). Everything else is None. Nothing is evaluated.

    Args:
        text: an extracted answer or a ground truth.

    Returns:
        A `Fraction`, or None.

    Examples:
        >>> normalize_numeric_answer(r"\\$1,000.00")
        Fraction(1000, 1)
        >>> normalize_numeric_answer(r"\\frac{1}{2}") == normalize_numeric_answer("0.5")
        True
        >>> normalize_numeric_answer("3 + 4") is None
        True
    """
    if not isinstance(text, str):
        raise TypeError(f"normalize_numeric_answer: text must be str, got {type(text).__name__}")
    cleaned = _strip_decorations(text)
    if len(cleaned) > _MAX_NUMBER_CHARS:
        return None
    match = _DECIMAL_RE.fullmatch(cleaned)
    if match:
        value = _to_fraction(match["num"])
        return -value if match["sign"] == "-" else value
    match = _SLASH_FRACTION_RE.fullmatch(cleaned) or _LATEX_FRACTION_RE.fullmatch(cleaned)
    if match:
        denominator = _to_fraction(match["den"])
        if denominator == 0:
            return None
        value = _to_fraction(match["num"]) / denominator
        return -value if match["sign"] == "-" else value
    return None


def grade_answer(given: str | None, ground_truth: str) -> bool:
    """Whether an extracted answer equals the ground truth as an exact number.

    Args:
        given: the extracted answer (e.g. from `extract_boxed`), or None when there was none.
        ground_truth: the reference answer (e.g. from `gsm8k_ground_truth`).

    Returns:
        True iff both normalise to numbers (`normalize_numeric_answer`) and the numbers are
        equal. A non-numeric answer is never correct, even if it equals the ground truth
        textually (GSM8K ground truths are all integers).

    Examples:
        >>> grade_answer("18.00", "18"), grade_answer("1,000", "1000"), grade_answer("17", "18")
        (True, True, False)
    """
    if given is None:
        return False
    expected = normalize_numeric_answer(ground_truth)
    if expected is None:
        return False
    value = normalize_numeric_answer(given)
    return value is not None and value == expected


def grade_boxed_response(response: str, ground_truth: str) -> bool:
    """`grade_answer` applied to the last `\\boxed{...}` of a whole response."""
    return grade_answer(extract_boxed(response), ground_truth)


# --- the GSM8K prompt (Tinker tutorial 104, "first RL") -------------------------------------------

GSM8K_QUESTION_SUFFIX = " Provide a numerical answer without units, written inside \\boxed{}."
"""Appended to every GSM8K question (and to the few-shot question)."""

_STRAWBERRY_QUESTION = "How many r's are in strawberry?"
_STRAWBERRY_SOLUTION = (
    "Let's spell the word out and number all the letters: "
    "1) s 2) t 3) r 4) a 5) w 6) b 7) e 8) r 9) r 10) y. "
    "We have r's at positions 3, 8, and 9. \\boxed{3}"
)


def gsm8k_question(question: str) -> str:
    """The user message for a GSM8K question: the question plus `GSM8K_QUESTION_SUFFIX`."""
    return question + GSM8K_QUESTION_SUFFIX


def gsm8k_fewshot_prefix() -> list[dict[str, str]]:
    """The tutorial's one-shot conversation prefix (the strawberry example), as new dicts.

    A function rather than a module constant so no caller can mutate shared state.

    Returns:
        `[user message, assistant message]` in the `{"role", "content"}` form of
        `rlpure.render.Message`; the assistant answers `\\boxed{3}`.
    """
    return [
        {"role": "user", "content": gsm8k_question(_STRAWBERRY_QUESTION)},
        {"role": "assistant", "content": _STRAWBERRY_SOLUTION},
    ]
