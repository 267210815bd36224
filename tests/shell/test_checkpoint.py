"""checkpoints.jsonl survives a torn last line; checkpoint names never collide."""

from __future__ import annotations

import asyncio
from pathlib import Path

from shell.fakes import FakeServiceClient
from shell.training._checkpoints import (
    CHECKPOINTS_FILE,
    CheckpointRecord,
    append_checkpoint,
    load_checkpoints,
    save_checkpoint,
)


def _record(step: int) -> CheckpointRecord:
    return CheckpointRecord(
        step=step, name=f"s{step}", state_path=f"/tmp/s{step}", rng_key_data=(0, step),
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
