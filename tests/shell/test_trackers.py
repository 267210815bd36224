"""Experiment trackers: a W&B offline run (and TensorBoard event files) read back hold exactly
the keys and values of the run's metrics.jsonl rows, the config once, and the run's end."""

from __future__ import annotations

import asyncio
import json
import struct
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shell.config import TrainConfig, build_config, config_to_dict
from shell.errors import ConfigError
from shell.fakes import FakeServiceClient, ScriptedDataset, ScriptedEnv, ScriptedGroupBuilder
from shell.training import train
from shell.training._logs import read_jsonl
from shell.training._trackers import Trackers, check_trackers, open_trackers

wandb = pytest.importorskip("wandb")
from wandb.proto import wandb_internal_pb2  # noqa: E402

# --- reading an offline run back -------------------------------------------------------------

_BLOCK = 32768  # the .wandb file is a LevelDB-style log: 32 KiB blocks of CRC-framed chunks
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(path: Path) -> list[Any]:
    """Every `Record` protobuf of a `.wandb` transaction log, in order."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B transaction log"
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        payload, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == _FULL:
            records.append(payload)
        elif kind == _FIRST:
            pending = payload
        elif kind == _MIDDLE:
            pending += payload
        elif kind == _LAST:
            records.append(pending + payload)
    parsed = []
    for raw in records:
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
        record.ParseFromString(raw)
        parsed.append(record)
    return parsed


def _offline_run(wandb_dir: Path) -> dict[str, Any]:
    """The one offline run under `wandb_dir`: name, project, config, history by step, exit.

    `run.finish()` returns before W&B's service has written the run's exit record (seen with
    wandb 0.31: the record lands some 100 ms later), so this waits up to 10 s for it.
    """
    (path,) = wandb_dir.glob("wandb/offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 10.0
    while True:
        run = _read_run(path)
        if run["exit_code"] is not None or time.monotonic() > deadline:
            return run
        time.sleep(0.05)


def _read_run(path: Path) -> dict[str, Any]:
    run: dict[str, Any] = {"history": {}, "config": {}, "exit_code": None}
    for record in _records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run["name"], run["project"] = record.run.display_name, record.run.project
            run["config"].update(
                {i.key: json.loads(i.value_json) for i in record.run.config.update}
            )
        elif kind == "config":
            run["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            values = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            run["history"][record.history.step.num] = {
                k: v for k, v in values.items() if not k.startswith("_")
            }
        elif kind == "exit":
            run["exit_code"] = record.exit.exit_code
    run["config"].pop("_wandb", None)
    return run


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    wandb_dir = tmp_path / "wandb-dir"
    wandb_dir.mkdir()
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(wandb_dir),
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        # what the offline run would gather besides our rows (git, system stats, pip list):
        # off, it makes each later init ~0.1 s instead of ~0.7 s
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
        "WANDB_X_DISABLE_STATS": "true",
        "WANDB_X_DISABLE_META": "true",
        "WANDB_X_SAVE_REQUIREMENTS": "false",
    }.items():
        monkeypatch.setenv(name, value)
    return wandb_dir


# --- a fake-SDK run ----------------------------------------------------------------------------


def _dataset(num_batches: int) -> ScriptedDataset:
    def builder(batch: int, problem: int) -> ScriptedGroupBuilder:
        target = 3 + (batch * 5 + problem) % 7

        def reward(action: np.ndarray) -> float:
            return float(np.mean(action == target)) if len(action) else 0.0

        return ScriptedGroupBuilder(
            lambda _: ScriptedEnv(prompt=[1, 2, target], reward_fn=reward, stop=()),
            group_size=3,
        )

    return ScriptedDataset(builder, num_batches=num_batches, groups_per_batch=2)


def _config(log_dir: Path, **options: Any) -> TrainConfig:
    return build_config(
        {"log_dir": str(log_dir), "backend": "fake", "progress": False, "max_tokens": 3},
        options,
    )


ROWS = [
    {
        "step": 0,
        "progress/batch": 0,
        "env/all/reward/total": 0.25,
        "tokens/sampled": 12,
        "test/env/all/correct": 0.5,
        "time/total": 0.125,
    },
    {
        "step": 1,
        "progress/batch": 1,
        "env/all/reward/total": 0.5,
        "tokens/sampled": 9,
        "time/total": 0.0625,
    },
    {"step": 2, "final_eval": 1, "test/env/all/correct": 0.75},
]
"""metrics.jsonl rows as the loop writes them (a train row with an eval, a final eval row)."""


def _by_step(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The rows merged by step, without the `step` key (the trackers' own step axis)."""
    merged: dict[int, dict[str, Any]] = {}
    for row in rows:
        merged.setdefault(int(row["step"]), {}).update(
            {key: value for key, value in row.items() if key != "step"}
        )
    return merged


# --- W&B ---------------------------------------------------------------------------------------


@pytest.mark.slow  # the process's first wandb.init starts W&B's service: ~2 s, ~7 s loaded
def test_a_wandb_offline_run_holds_exactly_the_rows_logged_and_the_config(
    tmp_path: Path, offline: Path
) -> None:
    rows = ROWS
    config = _config(tmp_path / "run", wandb_project="rlpure-tests", wandb_name="fake-run")
    with open_trackers(config, recipe_options={"batch_size": 2}) as trackers:
        assert trackers
        for row in rows:
            trackers.log_metrics(row, step=int(row["step"]))
    run = _offline_run(offline)
    assert (run["project"], run["name"], run["exit_code"]) == ("rlpure-tests", "fake-run", 0)
    assert run["history"] == _by_step(rows)
    assert run["config"] == {**config_to_dict(config), "recipe_options": {"batch_size": 2}}


def test_a_block_that_raises_finishes_the_run_as_failed(tmp_path: Path, offline: Path) -> None:
    config = _config(tmp_path, wandb_project="p")
    with pytest.raises(RuntimeError, match="boom"), open_trackers(config) as trackers:
        trackers.log_metrics({"step": 0, "x": 1.5}, step=0)
        raise RuntimeError("boom")
    run = _offline_run(offline)
    assert run["exit_code"] == 1
    assert run["history"] == {0: {"x": 1.5}}
    trackers.finish()  # finishing twice is harmless


def test_without_wandb_asking_for_it_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    config = _config(tmp_path, wandb_project="p")
    message = r"^TrainConfig.wandb_project: wandb is not installed; .*'rlpure\[wandb\]'$"
    with pytest.raises(ConfigError, match=message):
        check_trackers(config)
    with pytest.raises(ConfigError, match=message):
        open_trackers(config)


def test_no_tracker_asked_for_starts_nothing(tmp_path: Path) -> None:
    trackers = open_trackers(_config(tmp_path))
    assert not trackers
    check_trackers(_config(tmp_path))
    with trackers:
        trackers.log_metrics({"step": 0}, step=0)
    assert not (tmp_path / "wandb").exists()


def test_wandb_name_needs_a_project(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"TrainConfig.wandb_name: .*needs wandb_project"):
        _config(tmp_path, wandb_name="n")


# --- TensorBoard -------------------------------------------------------------------------------


def _tensorboard_scalars(logdir: Path) -> dict[int, dict[str, float]]:
    """`{step: {tag: value}}` of the scalar summaries in TFRecord event files under `logdir`."""
    event_pb2 = pytest.importorskip("tensorboardX.proto.event_pb2")
    scalars: dict[int, dict[str, float]] = {}
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalars.setdefault(event.step, {})[value.tag] = value.simple_value
    return scalars


def test_tensorboard_scalars_are_the_numeric_values_of_the_rows(tmp_path: Path) -> None:
    pytest.importorskip("tensorboardX")
    rows: list[dict[str, Any]] = [
        {"step": 0, "env/all/reward/total": 0.25, "note": "text", "flag": True},
        {"step": 1, "env/all/reward/total": 0.5, "tokens/sampled": 12},
    ]
    logdir = tmp_path / "tb"
    config = _config(tmp_path, tensorboard_dir=str(logdir))
    with open_trackers(config) as trackers:
        for row in rows:
            trackers.log_metrics(row, step=int(row["step"]))
    assert _tensorboard_scalars(logdir) == {
        0: {"env/all/reward/total": 0.25},
        1: {"env/all/reward/total": 0.5, "tokens/sampled": 12.0},
    }


def test_trackers_finish_in_order_and_once() -> None:
    finished: list[tuple[str, int]] = []

    class Recording:
        def __init__(self, name: str) -> None:
            self.name = name

        def log_metrics(self, row: Any, *, step: int) -> None:
            pass

        def finish(self, *, exit_code: int) -> None:
            finished.append((self.name, exit_code))

    trackers = Trackers([Recording("a"), Recording("b")])
    with pytest.raises(KeyboardInterrupt), trackers:
        raise KeyboardInterrupt
    trackers.finish()
    assert finished == [("a", 1), ("b", 1)]


# --- the loop logs to the trackers -------------------------------------------------------------


@pytest.mark.slow  # ~9 s alone (first JAX compilations), ~2 s in a warm suite
def test_a_fake_run_with_wandb_logs_the_same_rows_as_metrics_jsonl(
    tmp_path: Path, offline: Path
) -> None:
    config = _config(tmp_path / "run", wandb_project="rlpure-tests", wandb_name="loop")
    asyncio.run(train(config, dataset=_dataset(3), service_client=FakeServiceClient()))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    run = _offline_run(offline)
    assert (run["name"], run["exit_code"]) == ("loop", 0)
    assert run["history"] == _by_step(rows)
    assert run["config"] == config_to_dict(config)


def test_a_run_that_fails_finishes_its_wandb_run_as_failed(tmp_path: Path, offline: Path) -> None:
    def failing(batch: int, problem: int) -> ScriptedGroupBuilder:
        return ScriptedGroupBuilder(
            lambda _: ScriptedEnv(prompt=[1, 2], rewards=[1.0], fail_at_step=0), group_size=2
        )

    dataset = ScriptedDataset(failing, num_batches=2, groups_per_batch=1)
    config = _config(tmp_path / "run", wandb_project="p")
    with pytest.raises(Exception):  # noqa: B017 (the env's scripted failure, whatever its class)
        asyncio.run(train(config, dataset=dataset, service_client=FakeServiceClient()))
    assert _offline_run(offline)["exit_code"] == 1


class _Finishing:
    """A tracker that records its exit code, or raises when asked to finish."""

    def __init__(self, *, fails: bool) -> None:
        self.fails = fails
        self.exit_codes: list[int] = []

    def log_metrics(self, row: Any, *, step: int) -> None:
        del row, step

    def finish(self, *, exit_code: int) -> None:
        self.exit_codes.append(exit_code)
        if self.fails:
            raise OSError("disk full")


def test_a_tracker_that_fails_to_finish_leaves_the_others_finished() -> None:
    first, second = _Finishing(fails=True), _Finishing(fails=False)
    with pytest.raises(OSError, match="disk full"):
        Trackers([first, second]).finish(exit_code=1)
    assert (first.exit_codes, second.exit_codes) == ([1], [1])
