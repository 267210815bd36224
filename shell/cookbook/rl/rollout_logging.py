"""The cookbook's `tinker_cookbook.rl.rollout_logging`: rollout-summary records.

A thin facade over `shell.training._rollout_pages` (the loop writes these records to
`iteration_NNNNNN/{base}_rollout_summaries.jsonl`). The two JSONL writers are the cookbook's
deprecated ones, past their removal version in 0.6.1: calling either raises the `RuntimeError`
the cookbook's `utils.deprecation` raises there, word for word.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from rlpure.records import TrajectoryGroup
from shell.cookbook import __version__
from shell.training._rollout_pages import (
    RolloutSummaryExportConfig,
    RolloutSummaryGroup,
    rollout_summaries_jsonl_path,
    serialize_rollout_summaries,
    serialize_rollout_summaries_from_groups,
)

__all__ = [
    "RolloutSummaryExportConfig",
    "RolloutSummaryGroup",
    "rollout_summaries_jsonl_path",
    "serialize_rollout_summaries",
    "serialize_rollout_summaries_from_groups",
    "write_rollout_summaries_jsonl",
    "write_rollout_summaries_jsonl_from_groups",
]

_REMOVED_IN = "0.4.0"


def _removed() -> NoReturn:
    raise RuntimeError(
        "'Function write_rollout_summaries_jsonl' is deprecated. It will be removed in version "
        f"{_REMOVED_IN}. Use serialize_rollout_summaries() + store.write_rollouts() instead. "
        f"(Current version is {__version__}; this should have been removed by {_REMOVED_IN}.)"
    )


def write_rollout_summaries_jsonl(
    path: str | Path,
    *,
    split: str,
    iteration: int,
    trajectory_groups_P: Sequence[TrajectoryGroup],
    taglist_P: Sequence[list[str]],
    sampling_client_steps_P: Sequence[int | None] | None = None,
) -> None:
    """Removed (deprecated until 0.4.0): raises `RuntimeError`, as in cookbook 0.6.1; use
    `serialize_rollout_summaries` and write the records."""
    _removed()


def write_rollout_summaries_jsonl_from_groups(
    path: Path, *, split: str, iteration: int, groups_P: Sequence[RolloutSummaryGroup]
) -> None:
    """Calls the removed `write_rollout_summaries_jsonl`: raises its `RuntimeError`."""
    _removed()
