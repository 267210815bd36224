"""Differential tests against tinker-cookbook 0.6.1: per-tag trajectory metrics
(`rl/metric_util.compute_trajectory_metrics`) and `\\boxed` answer extraction
(`recipes/math_rl/math_grading.extract_boxed`).

- `rlpure.metrics.trajectory_metrics` gives the cookbook's numbers for any batch whose groups
  list each tag once. A tag listed twice by one group is a deliberate difference: rlpure counts
  the group once, the cookbook appends it twice, doubling its episodes and weighting it double
  in every mean of that tag.
- `rlpure.tasks.math_grading.extract_boxed` gives the cookbook's answer (the cookbook's
  `ValueError` read as None) on braced and unbraced boxes (`\\boxed 7`), except the deliberate
  differences pinned below. The cookbook's `math_grading` needs math-verify and pylatexenc at
  import, so its `extract_boxed` (pure: `re` only) is compiled alone from its source.
Needs the cookbook (`make parity`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpure.metrics import trajectory_metrics
from rlpure.tasks.math_grading import extract_boxed
from rlpure.testing import batches
from shell.to_cookbook import to_cookbook_groups
from tests.parity.porting import require_cookbook

COOKBOOK = require_cookbook()

from tinker_cookbook.rl.metric_util import compute_trajectory_metrics  # noqa: E402


def _cookbook_extract_boxed() -> Callable[[str], str]:
    source = (COOKBOOK / "recipes" / "math_rl" / "math_grading.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    (node,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "extract_boxed"]
    namespace: dict[str, Any] = {"re": re}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "math_grading.py", "exec"), namespace)
    return namespace["extract_boxed"]


_CB_EXTRACT_BOXED = _cookbook_extract_boxed()


def _cookbook_answer(text: str) -> str | None:
    try:
        return _CB_EXTRACT_BOXED(text)
    except ValueError:  # "No boxed strings found" / "Unmatched }": no answer
        return None


# --- trajectory metrics per tag ----------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    batches(reward_kind="binary", prefix="mixed", max_group_size=3),
    st.data(),
)
def test_trajectory_metrics_with_tags_equal_the_cookbooks(groups_P: Any, data: Any) -> None:
    tags_P = [
        data.draw(st.lists(st.sampled_from(["math", "chat", "code"]), unique=True, max_size=2))
        for _ in groups_P
    ]
    ours = trajectory_metrics(groups_P, tags_P)
    theirs = compute_trajectory_metrics(to_cookbook_groups(groups_P), tags_P)
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        assert ours[key] == pytest.approx(float(value), rel=1e-9, abs=1e-12), key


@settings(max_examples=15, deadline=None)
@given(batches(reward_kind="binary", prefix="mixed", max_group_size=3).filter(lambda g: len(g) > 1))
def test_deliberate_a_tag_listed_twice_counts_its_group_once(groups_P: Any) -> None:
    once = [["math"]] + [["other"]] * (len(groups_P) - 1)
    twice = [["math", "math"], *once[1:]]
    theirs_once = compute_trajectory_metrics(to_cookbook_groups(groups_P), once)
    theirs_twice = compute_trajectory_metrics(to_cookbook_groups(groups_P), twice)
    episodes = float(len(groups_P[0].trajectories_G))
    assert theirs_once["env/math/total_episodes"] == episodes
    assert theirs_twice["env/math/total_episodes"] == 2 * episodes  # the cookbook: twice
    assert trajectory_metrics(groups_P, twice) == trajectory_metrics(groups_P, once)  # rlpure
    assert trajectory_metrics(groups_P, twice)["env/math/total_episodes"] == episodes


# --- \boxed answer extraction ------------------------------------------------------------------

SAME_ANSWER = [
    r"The answer is \boxed{42}.",
    r"\boxed{\frac{1}{2}}",
    r"first \boxed{1}, then \boxed{2}, finally \boxed{3}",
    r"\boxed{}",
    r"\boxed{\{1, 2\}}",
    "no box at all",
    "",
    r"\boxedx{5}",
    r"\fbox{5}",
    # unbraced: the cookbook's fallback when no braced box closes
    r"\boxed 7",
    r"so \boxed 42.",
    "\\boxed\n7",
    r"\boxed x",
    r"\boxed 3.5",
    r"\boxed -7",
    r"\boxed7",
    r"\boxed{3} then \boxed 4",
    r"\boxed 4 then \boxed{3}",
]


@pytest.mark.parametrize("text", SAME_ANSWER)
def test_extract_boxed_gives_the_cookbooks_answer(text: str) -> None:
    assert extract_boxed(text) == _cookbook_answer(text)


# (text, rlpure, cookbook): rlpure's module docstring gives the reasons.
DELIBERATE = [
    (r"\boxed 1, no: \boxed 2", "2", "1"),  # the last unbraced box is the answer
    (r"\boxed 7 then \boxed{8", None, "7"),  # a truncated last box: no answer
    (r"\boxed{3} and then \boxed{4", None, "3"),
    (r"\boxed{\boxed{3}}", "3", r"\boxed{3}"),  # the last \boxed is the inner one
    (r"\boxed {5}", "5", None),  # TeX reads it as a box
    (r"\boxed{ 18 }", "18", " 18 "),  # whitespace stripped
]


@pytest.mark.parametrize(("text", "ours", "theirs"), DELIBERATE)
def test_deliberate_extract_boxed_differences(
    text: str, ours: str | None, theirs: str | None
) -> None:
    assert extract_boxed(text) == ours
    assert _cookbook_answer(text) == theirs
