"""checkpoints.jsonl survives a torn last line; checkpoint names never collide; records name
states relative to their log dir and never outside it; every row format this project wrote
still resumes."""

from __future__ import annotations

import asyncio
import doctest
from pathlib import Path

import msgspec
import pytest

from shell.errors import CheckpointError
from shell.fakes import FakeServiceClient
from shell.training import _checkpoints, _resume, _saves
from shell.training._checkpoints import (
    CHECKPOINTS_FILE,
    CheckpointRecord,
    append_checkpoint,
    load_checkpoints,
    recorded_path,
    resolved_path,
)
from shell.training._saves import save_checkpoint


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
    assert doctest.testmod(_saves).failed == 0


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


def test_a_state_saved_outside_the_log_dir_on_purpose_resumes_where_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # `LocalServiceClient()` keeps its states in the user's store, outside any log dir (the
    # cookbook facade's documented `main(config, service_client=LocalServiceClient())`): its
    # rows are marked, read back as written, and resume; they used to be refused as a copied
    # log dir's, so a killed run could not resume even in place
    from tests.local.micro import MICRO_NAME, micro_service

    log_dir, store = tmp_path / "run", tmp_path / "store"
    service = micro_service(store)

    async def save() -> str:
        client = await service.create_lora_training_client_async(base_model=MICRO_NAME)
        await save_checkpoint(client, log_dir=log_dir, step=2, rng_key_data=(0, 1))
        return str(store)

    with caplog.at_level("WARNING"):
        asyncio.run(save())
    assert "saved outside this log dir" in caplog.text
    [row] = _rows(log_dir)
    assert row["outside_log_dir"] is True and "relative_state_path" not in row
    [record] = load_checkpoints(log_dir)
    assert record.step == 2 and Path(record.state_path).is_relative_to(store)
    assert Path(record.state_path).is_dir()
    kl = msgspec.structs.replace(record, kl_reference_path=str(store / "kl"))
    append_checkpoint(log_dir, kl)
    assert load_checkpoints(log_dir)[-1].kl_reference_path == str(store / "kl")
    # a row inside its log dir is not marked, and an unmarked absolute outside path is still
    # refused (`test_an_absolute_record_outside_the_log_dir_is_refused`)
    inside = msgspec.structs.replace(record, state_path=str(log_dir / "local_states" / "s"))
    append_checkpoint(log_dir, inside)
    assert "outside_log_dir" not in _rows(log_dir)[-1]


# --- cookbook-compatible rows ------------------------------------------------------------------


def _rows(log_dir: Path) -> list[dict[str, object]]:
    return [msgspec.json.decode(line) for line in (log_dir / CHECKPOINTS_FILE).read_bytes().splitlines()]  # fmt: skip


def test_rows_carry_the_cookbooks_keys_and_names(tmp_path: Path) -> None:
    service = FakeServiceClient()

    async def save() -> None:
        client = await service.create_lora_training_client(base_model="m")
        await save_checkpoint(client, log_dir=tmp_path, step=20, rng_key_data=(0, 1))
        await save_checkpoint(client, log_dir=tmp_path, step=30, rng_key_data=(0, 2), final=True)

    asyncio.run(save())
    first, last = _rows(tmp_path)
    assert (first["name"], first["batch"], first["step"]) == ("000020", 20, 20)
    assert (last["name"], last["batch"], last["final"]) == ("final", 30, True)
    assert str(first["state_path"]).startswith("fake://m/state/step_000020_")
    assert list(first)[:3] == ["name", "batch", "state_path"]
    assert {"rng_key_data", "wall_time", "kl_reference_path"} <= set(first)
    assert [r.name for r in load_checkpoints(tmp_path)] == ["000020", "final"]


def test_an_older_row_without_batch_still_loads(tmp_path: Path) -> None:
    old = {"step": 4, "name": "step_000004_17f", "state_path": "fake://s4",
           "rng_key_data": [0, 9], "final": False, "wall_time": 1.0, "kl_reference_path": None}  # fmt: skip
    (tmp_path / CHECKPOINTS_FILE).write_bytes(msgspec.json.encode(old) + b"\n")
    (record,) = load_checkpoints(tmp_path)
    assert (record.step, record.rng_key_data, record.rng_key_rederived) == (4, (0, 9), False)


def test_a_cookbook_row_resumes_at_its_batch_with_a_rederived_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows = [
        {"name": "000002", "batch": 2, "state_path": "/elsewhere/state/000002",
         "sampler_path": "/elsewhere/sampler/000002", "cumulative_tokens": {"sampled": 5}},
        {"name": "000003", "batch": 3, "sampler_path": "tinker://r/sampler_weights/000003"},
    ]  # fmt: skip
    (tmp_path / CHECKPOINTS_FILE).write_bytes(
        b"".join(msgspec.json.encode(r) + b"\n" for r in rows)
    )
    records = load_checkpoints(tmp_path, seed=7)
    assert len(records) == 1  # the sampler-only row is skipped, as the cookbook skips it
    with caplog.at_level("WARNING"):
        record = _resume.last_checkpoint(tmp_path, seed=7)
    assert record == records[0]
    assert (record.step, record.name, record.state_path) == (2, "000002", "/elsewhere/state/000002")
    assert record.rng_key_rederived and record.rng_key_data == _checkpoints.rederived_key_data(7, 2)
    assert record.rng_key_data != _checkpoints.rederived_key_data(0, 2)
    assert "written by tinker-cookbook" in caplog.text and "seed 7" in caplog.text
    assert not record.final
    final = {"name": "final", "batch": 5, "state_path": "/elsewhere/state/final"}
    (tmp_path / CHECKPOINTS_FILE).write_bytes(msgspec.json.encode(final) + b"\n")
    (record,) = load_checkpoints(tmp_path)
    assert record.final  # the cookbook's final row has no 'final' key: its name says it


@pytest.mark.parametrize(
    ("row", "missing"),
    [
        ({"name": "000002", "state_path": "fake://s"}, "'batch'"),
        ({"batch": 2, "epoch": 0}, "'name', 'state_path'"),
        ({"step": 2, "name": "s", "state_path": "fake://s"}, "'rng_key_data'"),
    ],
)
def test_a_row_that_is_neither_is_refused_naming_file_line_and_key(
    tmp_path: Path, row: dict[str, object], missing: str
) -> None:
    append_checkpoint(tmp_path, _record(1))
    with (tmp_path / CHECKPOINTS_FILE).open("ab") as f:
        f.write(msgspec.json.encode(row) + b"\n")
    with pytest.raises(CheckpointError, match=rf"checkpoints.jsonl: line 2: .*{missing}") as err:
        load_checkpoints(tmp_path)
    assert "\n" not in str(err.value)


def test_a_row_whose_batch_and_step_disagree_is_refused(tmp_path: Path) -> None:
    row = {
        "name": "000002",
        "batch": 3,
        "step": 2,
        "state_path": "fake://s",
        "rng_key_data": [0, 1],
    }
    (tmp_path / CHECKPOINTS_FILE).write_bytes(msgspec.json.encode(row) + b"\n")
    with pytest.raises(CheckpointError, match="line 1: 'batch' 3 and 'step' 2 disagree"):
        load_checkpoints(tmp_path)


_KEY = [1, 2]
_TOKENS = {"sampled": 3, "prefill_cached": 0, "prefill_uncached": 1, "trained": 2}


def _formats(old: Path) -> dict[str, dict[str, object]]:
    """One step-4 row of each format rlpure wrote, its log dir having been at `old`."""
    first = {"step": 4, "name": "step_000004_17f",
             "state_path": f"{old}/local_states/r/state/step_000004_17f", "rng_key_data": _KEY,
             "final": False, "wall_time": 1.0, "kl_reference_path": None}  # fmt: skip
    relative = {**first, "state_path": "local_states/r/state/step_000004_17f"}
    cookbook_keys = {**relative, "name": "000004", "batch": 4, "cumulative_tokens": _TOKENS,
                     "discarded_tokens": _TOKENS}  # fmt: skip
    today = {**cookbook_keys, "state_path": first["state_path"],
             "sampler_path": f"{old}/local_states/r/sampler/step_000004_17f",
             "relative_state_path": "local_states/r/state/step_000004_17f",
             "relative_sampler_path": "local_states/r/sampler/step_000004_17f"}  # fmt: skip
    return {"absolute": first, "relative": relative, "cookbook_keys": cookbook_keys,
            "today": today}  # fmt: skip


@pytest.mark.parametrize("version", ["absolute", "relative", "cookbook_keys", "today"])
def test_every_row_format_of_this_project_resumes(tmp_path: Path, version: str) -> None:
    log_dir = tmp_path / "D"
    log_dir.mkdir()
    row = _formats(log_dir)[version]
    (log_dir / CHECKPOINTS_FILE).write_bytes(msgspec.json.encode(row) + b"\n")
    (record,) = load_checkpoints(log_dir)
    assert (record.step, record.rng_key_data, record.rng_key_rederived) == (4, (1, 2), False)
    assert record.state_path == str(log_dir / "local_states/r/state/step_000004_17f")
    totals = _TOKENS if "batch" in row else dict.fromkeys(_TOKENS, 0)  # older: from zero
    assert record.cumulative_tokens.as_dict() == totals


@pytest.mark.parametrize("version", ["relative", "cookbook_keys", "today"])
def test_a_moved_log_dir_resumes_its_own_states_whatever_the_format(
    tmp_path: Path, version: str
) -> None:
    moved = tmp_path / "D2"
    moved.mkdir()
    row = _formats(tmp_path / "D")[version]  # written at D, then moved to D2
    (moved / CHECKPOINTS_FILE).write_bytes(msgspec.json.encode(row) + b"\n")
    (record,) = load_checkpoints(moved)
    assert record.state_path == str(moved / "local_states/r/state/step_000004_17f")
    if version == "today":
        assert record.sampler_path == str(moved / "local_states/r/sampler/step_000004_17f")


def test_the_first_format_moved_is_refused_saying_how_to_convert(tmp_path: Path) -> None:
    moved = tmp_path / "D2"
    moved.mkdir()
    row = _formats(tmp_path / "D")["absolute"]
    (moved / CHECKPOINTS_FILE).write_bytes(msgspec.json.encode(row) + b"\n")
    with pytest.raises(CheckpointError, match=r"line 1: .*outside the log dir.*sed -i") as err:
        load_checkpoints(moved)
    assert f"{tmp_path / 'D'}/" in str(err.value)


def test_rows_name_the_backends_absolute_path_and_the_log_dir_relative_one(
    tmp_path: Path,
) -> None:
    state = tmp_path / "local_states" / "r" / "state" / "s"
    record = msgspec.structs.replace(
        _record(3), state_path=str(state), sampler_path=str(state.parent.parent / "sampler" / "s")
    )
    append_checkpoint(tmp_path, record)
    (row,) = _rows(tmp_path)
    assert row["state_path"] == str(state)  # what the cookbook's main passes to the backend
    assert row["relative_state_path"] == "local_states/r/state/s"
    assert row["relative_sampler_path"] == "local_states/r/sampler/s"
    uri = msgspec.structs.replace(_record(4), sampler_path="fake://m/sampler/s4")
    append_checkpoint(tmp_path, uri)
    row = _rows(tmp_path)[1]
    assert row["state_path"] == "fake://s4" and "relative_state_path" not in row
    assert row["sampler_path"] == "fake://m/sampler/s4" and "relative_sampler_path" not in row
