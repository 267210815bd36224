"""Record names against tinker-cookbook 0.6.1's own loop: `rl.train.main` and ours
(`shell.cookbook.rl.train.main`) train the same two steps of the cookbook's arithmetic env (the cookbook
file as is, ours through the port rule) on the fake SDK (`shell.fakes.FakeServiceClient`), and
their `metrics.jsonl`, `timing_spans.jsonl` and `logs.log` are compared.

The metrics rows have the same keys except for the two explicit lists below, each with its
reason; a key appearing on one side only that is in neither list fails the test, and so does a
listed key that both sides now compute (the lists are kept exact).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.parity.porting import ported_module, require_cookbook

require_cookbook()

import tinker  # noqa: E402
import tinker_cookbook.rl.train as cookbook_train  # noqa: E402
from tinker_cookbook import tokenizer_utils  # noqa: E402
from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDatasetBuilder  # noqa: E402

from rlpure.model import ByteTokenizer  # noqa: E402
from shell.cookbook.rl import train as our_train  # noqa: E402
from shell.fakes import FakeServiceClient  # noqa: E402

MODEL = "rlpure/tiny"
RENDERER = "role_colon"
VOCAB = 256  # the fake samples byte tokens, which the byte tokenizer decodes

_ROLLOUT_SPANS = (
    "do_group_rollout_and_filter_constant_reward",
    "env_initial_observation",
    "policy_sample",
    "env_step",
    "compute_group_rewards",
)
COOKBOOK_ONLY: set[str] = set()
"""Nothing: both time each group's rollout and, inside it, every env and sampler call
(`_ROLLOUT_SPANS`: two groups, so aggregated keys; ours from `shell.rollouts`
through `shell.timing`); the rollouts' whole time is `time/sampling` on both sides."""

OURS_ONLY = {
    "batch/degenerate_groups_frac",
    "batch/num_datums",
    "batch/num_groups",
    "batch/num_trained_groups",
    "train/loss:sum",
    "time/train/fwd_bwd_substep_0_mb_0_enqueue",
    "time/train/fwd_bwd_substep_0_mb_0_consume",
    "time/train/optim_substep_0_enqueue",
    "time/train/optim_substep_0_consume",
}
"""Ours: the batch's shape (`batch/*`), the `forward_backward` loss metrics (`train/*`; the
cookbook keeps only the optimizer's), and the submit/await spans of each substep's calls,
named as the cookbook's streaming step names them (its sync `train_step` times no call)."""


class _ContextService(FakeServiceClient):
    """The fake as the cookbook's `main` opens a service: `tinker.ServiceClient(base_url=...,
    user_metadata=..., display_name=...)` used as a context manager."""

    def __init__(self, **_: Any) -> None:
        super().__init__(vocab_size=VOCAB)

    def __enter__(self) -> _ContextService:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _options(log_path: Path) -> dict[str, Any]:
    return {
        "learning_rate": 1e-3,
        "model_name": MODEL,
        "recipe_name": "metric_names_parity",
        "max_tokens": 4,
        "log_path": str(log_path),
        "renderer_name": RENDERER,
        "eval_every": 0,
        "max_steps": 2,
    }


def _builder_options() -> dict[str, Any]:
    return {
        "batch_size": 2,
        "model_name_for_tokenizer": MODEL,
        "renderer_name": RENDERER,
        "n_batches": 4,
        "group_size": 2,
    }


def _rows(log_path: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (log_path / name).read_text().splitlines()]


def _run_both(root: Path, **overrides: Any) -> tuple[Path, Path]:
    """The cookbook's `main` and ours on the same config (`_options` and `overrides`): their
    log dirs under `root`."""
    theirs, ours = root / "cookbook", root / "rlpure"
    tokenizer_utils.register_tokenizer(MODEL, ByteTokenizer)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(tinker, "ServiceClient", _ContextService)
            # offline: the cookbook's one network call (it fails soft without a network)
            patch.setattr(cookbook_train, "fetch_model_pricing", lambda model_name: None)
            builder = ArithmeticDatasetBuilder(**_builder_options())
            config = cookbook_train.Config(
                dataset_builder=builder, **{**_options(theirs), **overrides}
            )
            asyncio.run(cookbook_train.main(config))
    finally:
        tokenizer_utils.unregister_tokenizer(MODEL)
    port = ported_module("recipes/math_rl/arithmetic_env.py")
    ours_config = our_train.Config(
        dataset_builder=port.ArithmeticDatasetBuilder(**_builder_options()),
        **{**_options(ours), **overrides},
    )
    asyncio.run(our_train.main(ours_config, service_client=FakeServiceClient(vocab_size=VOCAB)))
    return theirs, ours


@pytest.fixture(scope="module")
def both_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """The two runs' log dirs (once for the module): the cookbook's, then ours."""
    yield _run_both(tmp_path_factory.mktemp("metric_names"))


def _iteration_files(log_path: Path) -> set[str]:
    return {p.relative_to(log_path).as_posix() for p in log_path.glob("iteration_*/*")}


def test_both_write_the_same_iteration_files_and_rollout_json_export_false_drops_the_same(
    both_runs: tuple[Path, Path], tmp_path: Path
) -> None:
    theirs, ours = (_iteration_files(path) for path in both_runs)
    assert "iteration_000000/train_rollout_summaries.jsonl" in theirs
    assert theirs == ours
    without = [_iteration_files(p) for p in _run_both(tmp_path, rollout_json_export=False)]
    assert (
        without[0]
        == without[1]
        == {name for name in theirs if not name.endswith("_rollout_summaries.jsonl")}
    )
    quiet = _run_both(tmp_path / "quiet", rollout_json_export=False, num_groups_to_log=0)
    assert [list(path.glob("iteration_*")) for path in quiet] == [[], []]  # not even folders


def test_step_rows_have_the_cookbooks_keys_for_everything_both_compute(
    both_runs: tuple[Path, Path],
) -> None:
    theirs, ours = (_rows(path, "metrics.jsonl") for path in both_runs)
    their_steps = [row for row in theirs if "progress/batch" in row]
    our_steps = [row for row in ours if "progress/batch" in row]
    assert [row["step"] for row in their_steps] == [row["step"] for row in our_steps] == [0, 1]
    for their_row, our_row in zip(their_steps, our_steps, strict=True):
        assert set(their_row) - set(our_row) == COOKBOOK_ONLY
        assert set(our_row) - set(their_row) == OURS_ONLY
        shared = set(their_row) & set(our_row)
        assert {"progress/batch", "progress/done_frac", "optim/lr", "optim/step"} <= shared
        assert {"time/total", "time/sampling", "time/train_step", "time/save_checkpoint"} <= shared
        assert {"env/all/total_cached_ob_tokens", "tokens/prefill_uncached"} <= shared
        # the same run: the counts that do not depend on what was sampled agree
        for key in ("progress/batch", "progress/done_frac", "optim/lr", "optim/step"):
            assert our_row[key] == their_row[key], key


def test_both_log_the_final_totals_row_after_the_last_step_with_the_same_keys(
    both_runs: tuple[Path, Path],
) -> None:
    """The cookbook's `main` logs one more metrics row after the last step, at `step=end_batch`
    (`CostTracker.cumulative_metrics()`: `tokens/cumulative/*`, `tokens/discarded/*`; no
    price table here, so no `cost/*`); ours logs the same row, marked `final_totals` (readers
    of step rows skip it by that key), holding the totals of its final checkpoint row, as the
    cookbook's."""
    kinds = {"sampled", "prefill_cached", "prefill_uncached", "trained"}
    totals_keys = {
        f"tokens/{total}/{kind}" for total in ("cumulative", "discarded") for kind in kinds
    }
    totals_rows = []
    for path in both_runs:
        rows = _rows(path, "metrics.jsonl")
        (totals,) = [row for row in rows if "progress/batch" not in row]
        assert totals is rows[-1] and totals["step"] == 2, path  # end_batch, after the steps
        final = _rows(path, "checkpoints.jsonl")[-1]
        assert final["name"] == "final"
        assert set(final["cumulative_tokens"]) == set(final["discarded_tokens"]) == kinds
        for kind in kinds:
            assert totals[f"tokens/cumulative/{kind}"] == final["cumulative_tokens"][kind], path
            assert totals[f"tokens/discarded/{kind}"] == final["discarded_tokens"][kind], path
        totals_rows.append(totals)
    theirs, ours = totals_rows
    assert set(theirs) == {"step"} | totals_keys
    assert set(ours) - {"final_totals"} == set(theirs) and ours["final_totals"] == 1


def test_timing_spans_rows_have_the_cookbooks_schema(both_runs: tuple[Path, Path]) -> None:
    theirs, ours = (_rows(path, "timing_spans.jsonl") for path in both_runs)
    assert [row["step"] for row in theirs] == [0, 1]
    assert [row["step"] for row in ours] == [0, 1, 2]  # 2: our final checkpoint's span
    for row in theirs + ours:
        assert set(row) == {"step", "spans"}
        assert all(set(s) == {"name", "duration", "wall_start", "wall_end"} for s in row["spans"])
    for their_row, our_row in zip(theirs, ours[:2], strict=True):
        their_names = {s["name"] for s in their_row["spans"]}
        our_names = {s["name"] for s in our_row["spans"]}
        assert set(_ROLLOUT_SPANS) <= their_names & our_names
        assert their_names - our_names == set()
        assert {f"time/{name}" for name in our_names - their_names} <= OURS_ONLY


def test_logs_log_lines_have_the_cookbooks_format(both_runs: tuple[Path, Path]) -> None:
    line = re.compile(r"^[\w.]+:\d+ \[(DEBUG|INFO|WARNING|ERROR|CRITICAL)\] ")
    for path in both_runs:
        lines = (path / "logs.log").read_text().splitlines()
        starts = [text for text in lines if line.match(text)]
        assert starts and "Command line invocation:" in starts[0], path
