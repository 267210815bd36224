"""Rollout reports against tinker-cookbook 0.6.1: the rollout-summary records equal the
cookbook's `rl.rollout_logging.serialize_rollout_summaries` on the same groups (keys, order and
values), and the files sit where the cookbook's `iteration_dir` / `rollout_summaries_jsonl_path`
put them. Skipped without the cookbook."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings

from rlpure.testing import batches
from shell.to_cookbook import to_cookbook_groups
from shell.training._rollout_pages import (
    iteration_dir,
    rollout_summaries_jsonl_path,
)
from tests.parity.porting import require_cookbook


@settings(max_examples=40, deadline=None)
@given(batches(reward_kind="binary", prefix="mixed", max_group_size=4))
def test_rollout_summaries_equal_the_cookbooks(groups_P) -> None:
    require_cookbook()
    from tinker_cookbook.rl.rollout_logging import serialize_rollout_summaries

    tags_P = [[f"env{p}", "all"] for p in range(len(groups_P))]
    theirs = serialize_rollout_summaries(
        split="eval/test",
        iteration=5,
        trajectory_groups_P=to_cookbook_groups(groups_P),
        taglist_P=tags_P,
        sampling_client_steps_P=[5] * len(groups_P),
    )
    mine = serialize_rollout_summaries(
        split="eval/test",
        iteration=5,
        trajectory_groups_P=groups_P,
        taglist_P=tags_P,
        sampling_client_steps_P=[5] * len(groups_P),
    )
    assert [list(r) for r in mine] == [list(r) for r in theirs]  # same keys, same order
    assert [list(s) for r in mine for s in r["steps"]] == [
        list(s) for r in theirs for s in r["steps"]
    ]
    # values, through JSON as both write them
    assert json.loads(json.dumps(mine)) == json.loads(json.dumps(theirs))


def test_report_paths_are_the_cookbooks(tmp_path: Path) -> None:
    require_cookbook()
    from tinker_cookbook.rl.rollout_logging import rollout_summaries_jsonl_path as cookbook_path
    from tinker_cookbook.utils.misc_utils import iteration_dir as cookbook_iteration_dir

    for step in (0, 7, 123456):
        assert iteration_dir(tmp_path, step) == cookbook_iteration_dir(tmp_path, step)
        directory = iteration_dir(tmp_path, step)
        for base in ("train", "eval_test"):
            assert rollout_summaries_jsonl_path(directory, base) == cookbook_path(directory, base)
