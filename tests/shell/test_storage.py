"""`shell.storage` (a run's files over local storage) and the evaluator hook the stores serve.

Behaviour without the cookbook: local paths and `file://` URIs; cloud URIs refused where used,
in one line naming the backend package; a run store's round trip, pickling and resume
truncation; `RLTestSetEvaluator._collect_eval_metrics` called on every evaluation (the hook
cookbook recipes override), and the cookbook facade's evaluator writing rollout summaries to a
store.
"""

from __future__ import annotations

import asyncio
import json
import pickle
from pathlib import Path

import pytest

from rlpure.records import TrajectoryGroup
from shell.cookbook.rl.metric_util import RLTestSetEvaluator as FacadeEvaluator
from shell.cookbook.rl.rollout_logging import RolloutSummaryExportConfig
from shell.cookbook.stores import TrainingRunStore as FacadeStore
from shell.errors import ConfigError
from shell.evaluation import RLTestSetEvaluator
from shell.fakes import (
    FakeSamplingClient,
    ScriptedDataset,
    ScriptedEnv,
    ScriptedGroupBuilder,
)
from shell.rollouts import RetryOnFailure
from shell.storage import (
    FsspecStorage,
    IncrementalReader,
    LocalStorage,
    RunRegistry,
    TrainingRunStore,
    storage_from_uri,
)


def test_local_paths_and_file_uris_give_local_storage(tmp_path: Path) -> None:
    for uri in (str(tmp_path / "a"), f"file://{tmp_path / 'b'}"):
        local = storage_from_uri(uri)
        assert isinstance(local, LocalStorage) and local.root.is_dir()
    assert (
        storage_from_uri(f"file://{tmp_path}/b").url("m.jsonl") == (tmp_path / "b/m.jsonl").as_uri()
    )


@pytest.mark.parametrize(
    ("uri", "package"),
    [("s3://bucket/runs/1", "s3fs"), ("gs://bucket/x", "gcsfs"), ("az://c/x", "adlfs")],
)
def test_a_cloud_uri_is_refused_in_one_line_naming_its_backend(uri: str, package: str) -> None:
    with pytest.raises(ConfigError) as raised:
        storage_from_uri(uri)
    message = str(raised.value)
    assert "\n" not in message and uri in message and f"pip install fsspec {package}" in message


def test_an_unknown_scheme_and_fsspec_storage_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"no hf:// backend"):
        storage_from_uri("hf://datasets/x")

    class S3Like:
        protocol = ("s3", "s3a")

    with pytest.raises(ConfigError, match=r"'s3://bucket/p'.*pip install fsspec s3fs"):
        FsspecStorage(S3Like(), "bucket/p")


def test_a_run_store_round_trips_and_pickles(tmp_path: Path) -> None:
    store = TrainingRunStore(LocalStorage(tmp_path), "runs/one")
    store.write_config({"lr": 0.1})
    store.write_metrics({"loss": 2.0}, step=0)
    store.write_metrics({"loss": 1.0}, step=1)
    assert store.read_metrics() == [{"step": 0, "loss": 2.0}, {"step": 1, "loss": 1.0}]
    copy = pickle.loads(pickle.dumps(store))
    assert copy.read_metrics() == store.read_metrics() and copy.read_config() == {"lr": 0.1}
    lines = (tmp_path / "runs/one/metrics.jsonl").read_text().splitlines()
    assert lines == ['{"step": 0, "loss": 2.0}', '{"step": 1, "loss": 1.0}']
    assert json.loads((tmp_path / "runs/one/config.json").read_text()) == {"lr": 0.1}


def test_truncating_metrics_keeps_the_old_file_beside_it(tmp_path: Path) -> None:
    store = TrainingRunStore(LocalStorage(tmp_path))
    assert store.truncate_metrics(0) == 0  # no file yet
    for step in range(3):
        store.write_metrics({"x": step}, step=step)
    store.write_metrics({"note": "no step"})
    before = (tmp_path / "metrics.jsonl").read_bytes()
    assert store.read_metrics()[-1] == {"note": "no step"}
    assert store.truncate_metrics(1) == 2
    assert store.read_metrics() == [{"step": 0, "x": 0}, {"note": "no step"}]
    assert (tmp_path / "metrics.jsonl.pre_resume_000001").read_bytes() == before
    assert store.truncate_metrics(5) == 0


def test_the_incremental_reader_waits_for_a_whole_line(tmp_path: Path) -> None:
    local = LocalStorage(tmp_path)
    reader = IncrementalReader(local, "m.jsonl", max_records=2)
    assert reader.read() == [] and not reader.has_data()
    local.append("m.jsonl", b'{"a": 1}\n{"b"')
    assert reader.read() == [{"a": 1}]
    local.append("m.jsonl", b': 2}\n{"c": 3}\n')
    assert reader.read() == [{"b": 2}, {"c": 3}]
    assert reader.records == [{"b": 2}, {"c": 3}] and reader.total_read == 3


def test_the_registry_finds_runs_one_level_down(tmp_path: Path) -> None:
    TrainingRunStore(LocalStorage(tmp_path / "r1")).write_config({"loss_fn": "ppo"})
    (tmp_path / "empty").mkdir()
    registry = RunRegistry([LocalStorage(tmp_path)])
    (run,) = registry.get_runs()
    assert (run.run_id, run.training_type, run.status, run.has_metrics) == (
        "r1",
        "rl",
        "idle",
        False,
    )
    assert registry.get_training_store("r1").read_config() == {"loss_fn": "ppo"}
    assert registry.get_eval_store() is None


def _dataset() -> ScriptedDataset:
    def builder(batch: int, problem: int) -> ScriptedGroupBuilder:
        return ScriptedGroupBuilder(
            lambda i: ScriptedEnv(
                rewards=[float(problem)], fail_at_step=0 if problem == 1 else None
            ),
            group_size=2,
        )

    return ScriptedDataset(builder, num_batches=1, groups_per_batch=3)


def test_every_evaluation_ends_in_the_collect_hook() -> None:
    seen: list[list[TrajectoryGroup | None]] = []

    class Extended(RLTestSetEvaluator):
        def _collect_eval_metrics(self, results, rollout_summary_export, *, store=None):  # type: ignore[no-untyped-def]
            seen.append(list(results))
            metrics = super()._collect_eval_metrics(results, rollout_summary_export, store=store)
            return {**metrics, f"{self.name}/extra": 1.0}

    evaluator = Extended(_dataset(), max_tokens=4, strategy=RetryOnFailure(max_retries=0))
    metrics = asyncio.run(evaluator(FakeSamplingClient()))
    assert metrics["test/extra"] == 1.0 and metrics["test/num_groups"] == 2.0
    ((first, failed, third),) = seen
    assert failed is None and first is not None and third is not None
    assert third.get_total_rewards() == [2.0, 2.0]
    assert evaluator.last_result is not None and evaluator.last_result.num_errors == 1


def test_the_facade_evaluator_writes_rollout_summaries_to_the_store(tmp_path: Path) -> None:
    store = FacadeStore(storage_from_uri(str(tmp_path)))
    evaluator = FacadeEvaluator(_dataset(), max_tokens=4, strategy=RetryOnFailure(max_retries=0))
    export = RolloutSummaryExportConfig(
        split="test", iteration=5, base_name="eval_test", sampling_client_step=4
    )
    asyncio.run(evaluator(FakeSamplingClient(), rollout_summary_export=export, store=store))
    records = store.read_rollouts(5, "eval_test")
    assert [(r["group_idx"], r["traj_idx"]) for r in records] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {r["sampling_client_step"] for r in records} == {4}
    assert [r["total_reward"] for r in records] == [0.0, 0.0, 2.0, 2.0]
    asyncio.run(evaluator(FakeSamplingClient(), rollout_summary_export=export))  # no store
    assert store.read_rollouts(5, "eval_test") == records
