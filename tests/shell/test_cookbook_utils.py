"""The rooms behind the cookbook facade's checkpoint and utility modules, without the cookbook:
plain checkpoint rows (`shell.training._checkpoints`), run metadata (`shell.run_metadata`),
and the facade modules over them (`shell.cookbook.checkpoint_utils`, `shell.cookbook.utils.*`).
The same modules against the cookbook itself: tests/parity/test_cookbook_utils_parity.py."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from shell import run_metadata
from shell.cookbook import checkpoint_utils
from shell.errors import CheckpointError
from shell.fakes import FakeServiceClient
from shell.training._checkpoints import (
    CHECKPOINTS_FILE,
    append_checkpoint_row,
    load_checkpoints,
    read_checkpoint_rows,
)

# --- plain checkpoint rows -----------------------------------------------------------------------


def test_rows_round_trip_as_written_in_the_cookbooks_bytes(tmp_path: Path) -> None:
    rows = [{"name": "000001", "batch": 1, "state_path": "/s", "mine": [1, {"a": None}]}]
    append_checkpoint_row(tmp_path, rows[0])
    assert read_checkpoint_rows(tmp_path) == rows
    assert (tmp_path / CHECKPOINTS_FILE).read_text() == json.dumps(rows[0]) + "\n"


def test_no_file_is_no_rows(tmp_path: Path) -> None:
    assert read_checkpoint_rows(tmp_path / "absent") == []


def test_a_torn_last_row_is_skipped_and_cut_before_the_next_append(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    append_checkpoint_row(tmp_path, {"name": "a"})
    with (tmp_path / CHECKPOINTS_FILE).open("a") as f:
        f.write('{"name": "b", "ba')
    with caplog.at_level(logging.WARNING):
        assert read_checkpoint_rows(tmp_path) == [{"name": "a"}]
    assert "torn last line" in caplog.text
    append_checkpoint_row(tmp_path, {"name": "c"})
    assert read_checkpoint_rows(tmp_path) == [{"name": "a"}, {"name": "c"}]


@pytest.mark.parametrize(
    ("text", "message"),
    [('{"name": "a"}\n{oops\n{"name": "c"}\n', "line 2: not JSON"),
     ('{"name": "a"}\n[1, 2]\n', "line 2: expected a JSON object, got list")],
)  # fmt: skip
def test_a_damaged_row_names_the_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / CHECKPOINTS_FILE).write_text(text)
    with pytest.raises(CheckpointError, match=message):
        read_checkpoint_rows(tmp_path)


def test_a_value_json_cannot_hold_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        append_checkpoint_row(tmp_path, {"name": "a", "x": object()})
    assert read_checkpoint_rows(tmp_path) == []


# --- checkpoint_utils over them ------------------------------------------------------------------


def test_a_recipes_rows_resume_at_its_last_state(tmp_path: Path) -> None:
    client = FakeServiceClient().create_lora_training_client(base_model="m").result()
    for batch in (2, 4):
        checkpoint_utils.save_checkpoint(client, f"{batch:06d}", str(tmp_path), {"batch": batch})
    checkpoint_utils.save_checkpoint(client, "final", str(tmp_path), {"batch": 5}, kind="sampler")
    last = checkpoint_utils.get_last_checkpoint(str(tmp_path))
    assert last is not None
    assert (last.name, last.batch, last.state_path) == ("000004", 4, "fake://m/state/000004")
    sampler = checkpoint_utils.get_last_checkpoint(str(tmp_path), required_key="sampler_path")
    assert sampler is not None and sampler.name == "final"


def test_rlpure_rows_read_as_the_cookbooks_records(tmp_path: Path) -> None:
    """A log dir the rlpure loop wrote: `get_last_checkpoint` gives its last row's cookbook
    keys and keeps rlpure's own in `extra`."""
    row = {
        "name": "000003",
        "batch": 3,
        "state_path": str(tmp_path / "local_states/s"),
        "cumulative_tokens": {"sampled": 1},
        "discarded_tokens": {},
        "step": 3,
        "rng_key_data": [0, 3],
        "final": False,
        "wall_time": 1.0,
        "kl_reference_path": None,
        "relative_state_path": "local_states/s",
    }
    append_checkpoint_row(tmp_path, row)
    (tmp_path / "local_states/s").mkdir(parents=True)
    assert load_checkpoints(tmp_path)[0].step == 3  # also rlpure's own row
    last = checkpoint_utils.get_last_checkpoint(str(tmp_path))
    assert last is not None
    assert (last.batch, last.final, last.get("step"), last.get("relative_state_path")) == (
        3,
        False,
        3,
        "local_states/s",
    )
    assert last.to_dict() == row


def test_save_checkpoint_async_submits_both_saves_before_awaiting(tmp_path: Path) -> None:
    service = FakeServiceClient()
    client = service.create_lora_training_client(base_model="m").result()
    client.events.clear()
    paths = asyncio.run(
        checkpoint_utils.save_checkpoint_async(client, "x", str(tmp_path), {}, kind="both")
    )
    assert paths == {"state_path": "fake://m/state/x", "sampler_path": "fake://m/sampler/x"}
    names = [event[0] for event in client.events]
    assert names.index("save_weights_for_sampler") < names.index("await")


# --- run metadata --------------------------------------------------------------------------------


class _Run:
    def __init__(self, metadata: dict[str, str] | None) -> None:
        self.user_metadata = metadata


class _Ready:
    def __init__(self, value: Any) -> None:
        self._value = value

    def result(self) -> Any:
        return self._value

    def __await__(self) -> Any:
        yield from asyncio.sleep(0).__await__()
        return self._value


class _Rest:
    def __init__(self, runs: dict[str, _Run]) -> None:
        self._runs = runs

    def get_training_run_by_tinker_path(self, tinker_path: str) -> _Ready:
        if tinker_path not in self._runs:
            raise ValueError(f"unknown checkpoint {tinker_path}")
        return _Ready(self._runs[tinker_path])


class _Service:
    def __init__(self, runs: dict[str, _Run]) -> None:
        self._runs = runs

    def create_rest_client(self) -> _Rest:
        return _Rest(self._runs)


SERVICE = _Service({"t://a": _Run({"renderer_name": "qwen3"}), "t://b": _Run(None)})


@pytest.mark.parametrize(("path", "expected"), [("t://a", "qwen3"), ("t://b", None)])
def test_the_renderer_recorded_for_a_checkpoint(path: str, expected: str | None) -> None:
    assert run_metadata.checkpoint_renderer_name(SERVICE, path) == expected
    assert asyncio.run(run_metadata.checkpoint_renderer_name_async(SERVICE, path)) == expected


def test_a_failed_lookup_is_a_warning_and_no_renderer(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert run_metadata.checkpoint_renderer_name(SERVICE, "t://none") is None
    assert "Could not fetch renderer metadata for checkpoint t://none" in caplog.text


def test_a_renderer_mismatch_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        assert run_metadata.check_checkpoint_renderer("p", expected="a", recorded="a")
        assert run_metadata.check_checkpoint_renderer("p", expected="a", recorded=None)
        assert not run_metadata.check_checkpoint_renderer("p", expected="a", recorded="b")
    assert [r.levelname for r in caplog.records] == ["INFO", "INFO", "WARNING"]


def test_recipe_metadata_names_the_recipe_and_this_projects_version() -> None:
    assert run_metadata.recipe_metadata("r") == {
        "recipe_name": "r",
        "git_rev": run_metadata.code_version(),
    }
    assert run_metadata.code_version() != "unknown"
