"""Differential tests: `shell.cookbook.stores` against tinker-cookbook 0.6.1's `stores`.

The same writes through either package's `TrainingRunStore` leave byte-identical folders; each
package reads the folder the other wrote as the other reads it (both directions); the run
registries find the same runs; `storage_join` and `LocalStorage` agree; the facade has the
cookbook's names and signatures. Last, forecasting's `ForecastEvaluator`, ported, reports its
AUC through rlpure's evaluator (which calls the `_collect_eval_metrics` hook it overrides).
Needs the cookbook (`make parity`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import os
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from rlpure.records import StepResult
from shell.fakes import FakeSamplingClient, ScriptedDataset, ScriptedEnv, ScriptedGroupBuilder
from tests.parity.porting import import_ported, require_cookbook, serve_ported_recipes

COOKBOOK = require_cookbook()

from tinker_cookbook.stores import registry as cb_registry  # noqa: E402
from tinker_cookbook.stores import storage as cb_storage  # noqa: E402
from tinker_cookbook.stores import training_store as cb_training_store  # noqa: E402

from shell.cookbook.stores import registry, storage, training_store  # noqa: E402

PACKAGES = {"cookbook": (cb_storage, cb_training_store), "rlpure": (storage, training_store)}


def _write_a_run(store: Any) -> None:
    """Every kind of write, in a training run's order (a resume at step 2 included)."""
    store.write_config({"model_name": "m", "loss_fn": "importance_sampling", "lr": 1e-4})
    for step in range(4):
        store.write_metrics({"train/loss": 1.0 / (step + 1), "name": "ü"}, step=step)
    store.write_metrics({"no_step": True})
    store.write_timing_spans(0, [{"name": "rollout", "duration": 1.5, "wall_start": 0.0}])
    store.write_timing_spans(1, [])
    store.write_checkpoint({"name": "000002", "batch": 2, "state_path": "tinker://s/2"})
    store.write_checkpoint({"name": "final", "batch": 3, "final": True, "sampler_path": "x"})
    rollouts = [
        {"group_idx": g, "traj_idx": t, "total_reward": g - t} for g in (0, 1) for t in (0, 1)
    ]
    store.write_rollouts(3, rollouts)
    store.write_rollouts(3, rollouts[:1], base_name="eval_gsm8k")
    store.write_rollouts(4, [])
    store.write_logtree(3, {"title": "step 3", "children": []})
    store.write_logtree(3, {"title": "eval"}, base_name="eval_gsm8k")
    store.write_code_diff("diff --git a/x b/x\n")
    assert store.truncate_metrics(2) == 2


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _reads(store: Any) -> dict[str, Any]:
    """Everything a store reads back, as plain data."""
    return {
        "config": store.read_config(),
        "metrics": store.read_metrics(),
        "new_metrics": store.read_new_metrics(),
        "metric_keys": store.metric_keys(),
        "timing": store.read_timing(),
        "checkpoints": store.read_checkpoints(),
        "checkpoint_records": [r.to_dict() for r in store.read_checkpoint_records()],
        "rollouts": store.read_rollouts(3),
        "eval_rollouts": store.read_rollouts(3, "eval_gsm8k"),
        "empty_rollouts": store.read_rollouts(4),
        "missing_rollouts": store.read_rollouts(9),
        "single": store.read_single_rollout(3, 1, 0),
        "no_single": store.read_single_rollout(3, 5, 0),
        "logtree": store.read_logtree(3),
        "eval_logtree": store.read_logtree(3, "eval_gsm8k"),
        "logtrees": store.list_logtrees(3),
        "iterations": [dataclasses.asdict(i) for i in store.list_iterations()],
        "url": store.url("metrics.jsonl"),
    }


def test_the_same_writes_leave_the_same_bytes(tmp_path: Path) -> None:
    for name, (storage_module, store_module) in PACKAGES.items():
        root = tmp_path / name / "run"
        _write_a_run(store_module.TrainingRunStore(storage_module.storage_from_uri(str(root))))
    assert _tree(tmp_path / "rlpure" / "run") == _tree(tmp_path / "cookbook" / "run")
    assert "metrics.jsonl.pre_resume_000002" in _tree(tmp_path / "rlpure" / "run")


@pytest.mark.parametrize("writer", ["cookbook", "rlpure"])
def test_each_reads_what_either_wrote_as_the_cookbook_does(writer: str, tmp_path: Path) -> None:
    root = tmp_path / "run"
    storage_module, store_module = PACKAGES[writer]
    _write_a_run(store_module.TrainingRunStore(storage_module.storage_from_uri(f"file://{root}")))
    with (root / "metrics.jsonl").open("ab") as file:
        file.write(b"not json\n\n" + b'{"step": 9, "half": ')  # a damaged line, a torn append
    ours = _reads(training_store.TrainingRunStore(storage.storage_from_uri(str(root))))
    theirs = _reads(cb_training_store.TrainingRunStore(cb_storage.storage_from_uri(str(root))))
    assert ours == theirs
    assert [m.get("step") for m in ours["metrics"]] == [0, 1, None]


def test_incremental_reads_see_only_whole_new_lines(tmp_path: Path) -> None:
    stores = {
        name: store_module.TrainingRunStore(storage_module.LocalStorage(tmp_path / name))
        for name, (storage_module, store_module) in PACKAGES.items()
    }
    seen: dict[str, list[Any]] = {name: [] for name in stores}
    for chunk in (b'{"step": 0, "a": 1}\n{"step": 1,', b' "b": 2}\n', b"", b'{"c": 3}\n'):
        for name, store in stores.items():
            store.storage.append("metrics.jsonl", chunk)
            seen[name].append((store.read_new_metrics(), sorted(store.metric_keys())))
    assert seen["rlpure"] == seen["cookbook"]
    assert seen["rlpure"][-1] == ([{"c": 3}], ["a", "b", "c"])


@pytest.mark.parametrize(
    "parts",
    [(), ("",), ("a",), ("/a/", "b/"), ("a", "", "b"), ("a/./b", "../c"), ("//",), ("a", "..")],
)
def test_storage_join_is_the_cookbooks(parts: tuple[str, ...]) -> None:
    assert storage.storage_join(*parts) == cb_storage.storage_join(*parts)


def test_local_storage_is_the_cookbooks(tmp_path: Path) -> None:
    def use(local: Any) -> list[Any]:
        local.write("d/f.bin", b"0123456789")
        local.append("d/f.bin", b"ab")
        local.append("d/g.txt", b"x")
        stat = local.stat("d/f.bin")
        found = [
            local.read("d/f.bin"),
            local.read_range("d/f.bin", 3, 4),
            local.read_range("d/f.bin", 10),
            local.exists("d/g.txt"),
            local.exists("nope"),
            local.stat("nope"),
            stat.size,
            local.list_dir("d"),
            local.list_dir("nope"),
            local.url("d/f.bin").removeprefix(local.root.as_uri()),
        ]
        local.remove("d/g.txt")
        local.remove("d/g.txt")
        local.remove_dir("d")  # not empty: nothing
        found.append(local.list_dir(""))
        with pytest.raises(ValueError, match="escapes storage root"):
            local.read("../outside")
        return found

    ours = use(storage.LocalStorage(tmp_path / "ours"))
    assert ours == use(cb_storage.LocalStorage(tmp_path / "theirs"))
    assert ours[0] == b"0123456789ab"


def _run_info(info: Any) -> dict[str, Any]:
    if isinstance(info, msgspec.Struct):
        return msgspec.structs.asdict(info)
    return dataclasses.asdict(info)


def test_the_registries_find_the_same_runs(tmp_path: Path) -> None:
    _write_a_run(training_store.TrainingRunStore(storage.LocalStorage(tmp_path / "rl_run")))
    old = training_store.TrainingRunStore(storage.LocalStorage(tmp_path / "old_sl"))
    old.write_config({"num_epochs": 1})
    old.write_metrics({"loss": 1.0}, step=0)
    past = time.time() - 3600
    os.utime(tmp_path / "old_sl" / "metrics.jsonl", (past, past))
    (tmp_path / "not_a_run").mkdir()
    (tmp_path / "rl_run" / "iteration_000007").mkdir()
    ours = registry.RunRegistry([storage.LocalStorage(tmp_path)])
    theirs = cb_registry.RunRegistry([cb_storage.LocalStorage(tmp_path)])
    assert [_run_info(r) for r in ours.get_runs()] == [_run_info(r) for r in theirs.get_runs()]
    assert [r.run_id for r in ours.get_runs()] == ["old_sl", "rl_run"]
    assert _reads(ours.get_training_store("rl_run")) == _reads(theirs.get_training_store("rl_run"))
    assert ours.get_run("nope") is None and theirs.get_run("nope") is None


def _params(function: Any) -> list[tuple[str, str, Any]]:
    return [
        (p.name, p.kind.name, p.default) for p in inspect.signature(function).parameters.values()
    ]


@pytest.mark.parametrize(
    "module", ["__init__", "_incremental", "storage", "training_store", "registry"]
)
def test_the_facade_has_the_cookbooks_names_and_signatures(module: str) -> None:
    suffix = "" if module == "__init__" else f".{module}"
    theirs = importlib.import_module(f"tinker_cookbook.stores{suffix}")
    ours = importlib.import_module(f"shell.cookbook.stores{suffix}")
    defined = getattr(theirs, "__all__", None) or [
        n
        for n, value in vars(theirs).items()
        if not n.startswith("_") and getattr(value, "__module__", None) == theirs.__name__
    ]
    assert [n for n in defined if not hasattr(ours, n)] == []
    for name in defined:
        cls = getattr(theirs, name)
        if not isinstance(cls, type) or name in ("Storage", "AsyncStorage"):
            continue  # protocols: their methods are checked on the classes
        assert _params(getattr(ours, name)) == _params(cls), f"{name}(...)"
        if name == "FsspecStorage":
            continue  # refused when built (no cloud backend here): no methods to reach
        for method, function in vars(cls).items():
            if callable(function) and not method.startswith("_"):
                assert _params(getattr(getattr(ours, name), method)) == _params(function), (
                    f"{name}.{method}"
                )


class _ForecastEnv(ScriptedEnv):
    """One step whose logs carry a forecast and its outcome, as forecasting's env logs them."""

    def __init__(self, forecast: float | str, outcome: int) -> None:
        super().__init__(rewards=[1.0])
        self.logs: dict[str, str | int | float | bool] = {"forecast": forecast, "outcome": outcome}

    async def step(self, action: Any, *, extra: Any = None) -> StepResult:
        return msgspec.structs.replace(await super().step(action, extra=extra), logs=self.logs)


def test_forecastings_evaluator_reports_its_auc_through_ours() -> None:
    """The ported `ForecastEvaluator` overrides `_collect_eval_metrics`; ours calls it."""
    points: list[tuple[float | str, int]] = [
        (0.9, 1),
        (0.8, 0),
        (0.3, 1),
        (0.1, 0),
        ("invalid", 1),
    ]  # AUC 3/4 over four

    def builder(batch: int, problem: int) -> ScriptedGroupBuilder:
        forecast, outcome = points[problem]
        return ScriptedGroupBuilder(
            lambda i: _ForecastEnv(forecast, outcome),
            group_size=1,
            tags=("a" if problem < 3 else "b",),
        )

    with serve_ported_recipes():
        forecasting = import_ported("recipes/forecasting/env.py")
    data = ScriptedDataset(builder, num_batches=1, groups_per_batch=len(points))
    evaluator = forecasting.ForecastEvaluator(data, max_tokens=4)
    metrics = asyncio.run(evaluator(FakeSamplingClient()))
    expected_all = forecasting.roc_auc([(0.9, 1), (0.8, 0), (0.3, 1), (0.1, 0)])
    assert metrics["test/env/all/auc"] == expected_all == 0.75
    assert metrics["test/env/a/auc"] == 0.5  # 0.9 and 0.3 (outcome 1) against 0.8 (outcome 0)
    assert "test/env/b/auc" not in metrics  # (0.1, 0) alone (the invalid one left out): undefined
    assert evaluator.last_result.metrics["env/all/auc"] == 0.75
