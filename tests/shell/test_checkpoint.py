"""checkpoints.jsonl survives a torn last line; checkpoint names never collide; records name
states relative to their log dir and never outside it."""

from __future__ import annotations

import asyncio
import doctest
from pathlib import Path

import msgspec
import pytest

from shell.errors import CheckpointError
from shell.fakes import FakeServiceClient
from shell.training import _checkpoints
from shell.training._checkpoints import (
    CHECKPOINTS_FILE,
    CheckpointRecord,
    append_checkpoint,
    load_checkpoints,
    recorded_path,
    resolved_path,
    save_checkpoint,
)


def _record(step: int) -> CheckpointRecord:
    return CheckpointRecord(
        step=step, name=f"s{step}", state_path=f"fake://s{step}", rng_key_data=(0, step),
        final=False, wall_time=0.0, kl_reference_path=None,
    )  # fmt: skip


def test_a_torn_last_line_is_dropped_before_the_next_append(tmp_path: Path) -> None:
    append_checkpoint(tmp_path, _record(1))
    append_checkpoint(tmp_path, _record(2))
    path = tmp_path / CHECKPOINTS_FILE
    path.write_bytes(path.read_bytes() + b'{"step": 3, "na')  # a crash mid-append
    assert [r.step for r in load_checkpoints(tmp_path)] == [1, 2]
    append_checkpoint(tmp_path, _record(3))
    assert [r.step for r in load_checkpoints(tmp_path)] == [1, 2, 3]
    assert path.read_bytes().count(b"\n") == 3


def test_saving_the_same_step_twice_uses_distinct_names(tmp_path: Path) -> None:
    service = FakeServiceClient()

    async def twice() -> None:
        client = await service.create_lora_training_client(base_model="m")
        for _ in range(2):
            await save_checkpoint(client, log_dir=tmp_path, step=2, rng_key_data=(0, 1))

    asyncio.run(twice())
    names = [event[1] for event in service.events if event[0] == "save_state"]
    assert len(names) == 2
    assert len(set(names)) == 2 and all(n.startswith("step_000002_") for n in names)
    assert [r.step for r in load_checkpoints(tmp_path)] == [2, 2]


def test_paths_inside_the_log_dir_are_recorded_relative_and_read_back_resolved(
    tmp_path: Path,
) -> None:
    log_dir = tmp_path / "run"
    state = log_dir / "local_states" / "m" / "state" / "s"
    stored = recorded_path(str(state), log_dir)
    assert stored == "local_states/m/state/s"
    assert recorded_path("tinker://abc/weights/s", log_dir) == "tinker://abc/weights/s"
    assert resolved_path(stored, log_dir, where="w") == str(state.resolve())
    assert resolved_path("tinker://abc/s", log_dir, where="w") == "tinker://abc/s"
    assert doctest.testmod(_checkpoints).failed == 0


@pytest.mark.parametrize("stored", ["../other/local_states/s", "local_states/../../x"])
def test_a_record_climbing_out_of_the_log_dir_is_refused(tmp_path: Path, stored: str) -> None:
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    record = msgspec.structs.replace(_record(1), state_path=stored)
    (log_dir / CHECKPOINTS_FILE).write_bytes(msgspec.json.encode(record) + b"\n")
    with pytest.raises(CheckpointError, match=r"checkpoints.jsonl: line 1: .*climbs out"):
        load_checkpoints(log_dir)


def test_an_absolute_record_outside_the_log_dir_is_refused(tmp_path: Path) -> None:
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    record = msgspec.structs.replace(_record(1), kl_reference_path="/elsewhere/kl")
    (log_dir / CHECKPOINTS_FILE).write_bytes(msgspec.json.encode(record) + b"\n")
    with pytest.raises(CheckpointError, match=r"line 1: the state /elsewhere/kl lies outside"):
        load_checkpoints(log_dir)
