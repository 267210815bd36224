"""Tests for restoring and recording a run (`shell.training`), directly on its functions.

The loop-level behaviour (a resumed `train` refusing changed options or a foreign client) is
tested in `tests/test_train.py`; here: which fields are compared, what is written, the PRNG key
round trip, and that `shell.training` still exports the names callers import from it.
"""

from __future__ import annotations

import doctest
import errno
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import pytest

import shell.training
from shell.config import TrainConfig, config_to_dict
from shell.errors import ConfigError
from shell.fakes import FakeCheckpointStore, FakeServiceClient, FakeTrainingClient
from shell.training import _restore, _resume, load_checkpoints
from shell.training._checkpoints import (
    CheckpointRecord,
    append_checkpoint,
    prng_key_data,
    prng_key_from_data,
    rederived_key_data,
)
from shell.training._restore import OpenedTrainingClient, callers_training_client
from shell.training._resume import (
    RESUME_MAY_CHANGE,
    check_resumable_config,
    checked_last_checkpoint,
    record_run_options,
)
from tests.shell.test_train import _config, _dataset, _train

# the on-disk names are part of a log directory's format: pinned, not imported
CONFIG_FILE, RECIPE_OPTIONS_FILE = "config.json", "recipe_options.json"
RECORD = CheckpointRecord(step=2, name="s2", state_path="fake://states/s2", rng_key_data=(0, 7))


def _recorded_run(
    log_dir: Path, config: TrainConfig, record_changes: Mapping[str, object] | None = None
) -> Path:
    """`log_dir` with one checkpoint and `config.json` (changed by `record_changes`)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    append_checkpoint(log_dir, RECORD)
    path = log_dir / CONFIG_FILE
    path.write_text(json.dumps({**config_to_dict(config), **(record_changes or {})}))
    return path


def test_docstring_examples_run() -> None:
    assert doctest.testmod(_resume).failed == 0


def test_shell_training_exports_the_resume_names_callers_need() -> None:
    for name in (
        "CONFIG_FILE",
        "RECIPE_OPTIONS_FILE",
        "RESUME_MAY_CHANGE",
        "OpenedTrainingClient",
        "checked_last_checkpoint",
        "open_training_client",
        "recipe_options",
    ):
        assert name in shell.training.__all__, name
        home = _restore if name in {"OpenedTrainingClient", "open_training_client"} else _resume
        assert getattr(shell.training, name) is getattr(home, name), name


def test_the_fields_that_may_change_are_config_fields() -> None:
    assert set(TrainConfig.__struct_fields__) >= RESUME_MAY_CHANGE


@pytest.mark.parametrize("name", sorted(TrainConfig.__struct_fields__))
def test_each_field_outside_resume_may_change_is_compared(tmp_path: Path, name: str) -> None:
    config = TrainConfig(log_dir=str(tmp_path))
    path = _recorded_run(tmp_path, config, {name: "recorded-value"})
    if name in RESUME_MAY_CHANGE:
        check_resumable_config(path, config)
        return
    with pytest.raises(ConfigError, match=rf"{tmp_path}: .*\b{name}: 'recorded-value' -> "):
        check_resumable_config(path, config)


def test_a_field_only_one_side_holds_is_not_a_change(tmp_path: Path) -> None:
    config = TrainConfig(log_dir=str(tmp_path))
    recorded = config_to_dict(config)
    del recorded["learning_rate"]
    recorded["field_of_an_older_version"] = 3
    path = tmp_path / CONFIG_FILE
    path.write_text(json.dumps(recorded))
    check_resumable_config(path, config)
    (tmp_path / RECIPE_OPTIONS_FILE).write_text('{"batch_size": 4, "old_option": 1}')
    check_resumable_config(path, config, recipe_options={"batch_size": 4, "new_option": 2})
    with pytest.raises(ConfigError, match=r"\(recipe option batch_size: 4 -> 5\)"):
        check_resumable_config(path, config, recipe_options={"batch_size": 5})


@pytest.mark.parametrize(
    ("text", "message"),
    [("{not json", r"unreadable \("), ("[1, 2]", "expected a JSON object")],
)
def test_an_unreadable_record_refuses_the_resume_naming_the_file(
    tmp_path: Path, text: str, message: str
) -> None:
    config = TrainConfig(log_dir=str(tmp_path))
    path = _recorded_run(tmp_path, config)
    (tmp_path / RECIPE_OPTIONS_FILE).write_text(text)
    check_resumable_config(path, config)  # recipe options not given: their file is not read
    with pytest.raises(ConfigError, match=rf"{RECIPE_OPTIONS_FILE}: {message}"):
        check_resumable_config(path, config, recipe_options={"a": 1})
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"{CONFIG_FILE}: {message}"):
        check_resumable_config(path, config)


def test_checked_last_checkpoint_checks_only_when_there_is_a_checkpoint(tmp_path: Path) -> None:
    config = TrainConfig(log_dir=str(tmp_path))
    (tmp_path / CONFIG_FILE).write_text('{"seed": 99}')
    assert checked_last_checkpoint(config) is None  # a fresh run overwrites the record
    _recorded_run(tmp_path, config, {"seed": 99})
    with pytest.raises(ConfigError, match=r"seed: 99 -> 0"):
        checked_last_checkpoint(config)
    _recorded_run(tmp_path, config)
    assert checked_last_checkpoint(config) == RECORD


def test_record_run_options_writes_both_records_and_keeps_or_drops_the_old_one(
    tmp_path: Path,
) -> None:
    config = TrainConfig(log_dir=str(tmp_path), seed=3)
    record_run_options(tmp_path, config, recipe_options={"shape": (1, 2)}, resuming=False)
    assert json.loads((tmp_path / CONFIG_FILE).read_text()) == config_to_dict(config)
    assert json.loads((tmp_path / RECIPE_OPTIONS_FILE).read_text()) == {"shape": [1, 2]}
    # a resumed run given no recipe options keeps the record; a fresh one drops it
    record_run_options(tmp_path, config, recipe_options=None, resuming=True)
    assert (tmp_path / RECIPE_OPTIONS_FILE).exists()
    record_run_options(tmp_path, config, recipe_options=None, resuming=False)
    assert not (tmp_path / RECIPE_OPTIONS_FILE).exists()
    with pytest.raises(ConfigError, match=r"recipe_options=...\): not JSON-encodable"):
        record_run_options(tmp_path, config, recipe_options={"x": object()}, resuming=False)


def test_a_failed_rewrite_of_the_run_records_leaves_the_old_ones_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk (or a kill) while `config.json` is rewritten at a resume must not leave a
    cut-off file that refuses every later resume."""
    old = TrainConfig(log_dir=str(tmp_path), seed=3)
    record_run_options(tmp_path, old, recipe_options=None, resuming=False)
    before = (tmp_path / CONFIG_FILE).read_bytes()
    real_write_text = Path.write_text

    def full_disk(self: Path, data: str, *args: Any, **kwargs: Any) -> int:
        real_write_text(self, data[: len(data) // 2], *args, **kwargs)  # half, then ENOSPC
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    longer = TrainConfig(log_dir=str(tmp_path / ("x" * 200)), seed=3)
    with pytest.raises(OSError, match="No space left"):
        record_run_options(tmp_path, longer, recipe_options=None, resuming=True)
    monkeypatch.undo()
    assert (tmp_path / CONFIG_FILE).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [CONFIG_FILE]  # no half-written copy


@pytest.mark.parametrize("seed", [0, 1, 2**31 - 1])
def test_a_restored_prng_key_draws_what_the_saved_one_draws(seed: int) -> None:
    key = jax.random.split(jax.random.key(seed))[1]
    data = prng_key_data(key)
    assert all(isinstance(word, int) and 0 <= word < 2**32 for word in data)
    restored = prng_key_from_data(data)
    assert prng_key_data(restored) == data
    assert int(jax.random.randint(restored, (), 0, 2**31 - 1)) == int(
        jax.random.randint(key, (), 0, 2**31 - 1)
    )


def test_callers_training_client_unwraps_a_client_opened_for_the_same_checkpoint(
    tmp_path: Path,
) -> None:
    client = FakeTrainingClient(base_model="m", rank=1, store=FakeCheckpointStore(), events=[])
    fresh = OpenedTrainingClient(client=client, resumed_from=None)
    resumed = OpenedTrainingClient(client=client, resumed_from=RECORD)
    assert callers_training_client(fresh, resume=None, log_dir=tmp_path) is client
    assert callers_training_client(resumed, resume=RECORD, log_dir=tmp_path) is client
    assert callers_training_client(client, resume=None, log_dir=tmp_path) is client
    with pytest.raises(ConfigError, match=r"opened from no checkpoint \(a fresh run\), but "):
        callers_training_client(fresh, resume=RECORD, log_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"resuming from the step-2 checkpoint fake://states/s2"):
        callers_training_client(client, resume=RECORD, log_dir=tmp_path)


def test_a_rederived_key_is_the_key_the_loop_holds_after_those_steps(tmp_path: Path) -> None:
    _train(_config(tmp_path, seed=11, save_every=2), FakeServiceClient(), _dataset(3))
    saved = {r.step: r.rng_key_data for r in load_checkpoints(tmp_path)}
    assert set(saved) == {2, 3}
    assert saved == {step: rederived_key_data(11, step) for step in saved}


def test_checked_last_checkpoint_rederives_a_cookbook_rows_key_from_the_runs_seed(
    tmp_path: Path,
) -> None:
    config = TrainConfig(log_dir=str(tmp_path), backend="fake", seed=5)
    row = {"name": "000004", "batch": 4, "state_path": "fake://m/state/000004"}
    (tmp_path / "checkpoints.jsonl").write_text(json.dumps(row) + "\n")
    resume = checked_last_checkpoint(config)
    assert resume is not None and resume.rng_key_rederived
    assert (resume.step, resume.rng_key_data) == (4, rederived_key_data(5, 4))
