"""Overwriting a local checkpoint is crash-safe.

The old checkpoint is never deleted before the new one is in place: failures injected into
`os.replace` (the move into place, the put-back) or into writing the arrays leave the old
checkpoint readable, a crash between the two renames leaves both copies and an error that
points at them, and a failed delete of the old copy only logs a warning.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tinker import types

from shell.errors import CheckpointError
from shell.local import LocalTrainingClient
from shell.local._checkpoints import _HOST, read_checkpoint
from tests.local.micro import (
    micro_service,
    micro_trainer,
    params_equal,
)


def _hidden_siblings(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.parent.iterdir() if p.name.startswith("."))


def _step(trainer: LocalTrainingClient) -> None:
    """One Adam step that changes the weights without a gradient (decoupled weight decay)."""
    trainer.optim_step(types.AdamParams(learning_rate=0.1, weight_decay=0.5)).result()


def _fail_replace(
    monkeypatch: pytest.MonkeyPatch, *, fail_when: Callable[[str], bool]
) -> list[tuple[str, str]]:
    """Makes `os.replace` (as the checkpoint module sees it) raise for chosen sources."""
    real_replace = os.replace
    calls: list[tuple[str, str]] = []

    def replace(src: Any, dst: Any) -> None:
        calls.append((Path(src).name, Path(dst).name))
        if fail_when(Path(src).name):
            raise OSError(f"injected failure moving {src}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    return calls


def test_an_overwrite_leaves_only_the_new_checkpoint(tmp_path: Path) -> None:
    trainer = micro_trainer(tmp_path)
    path = Path(trainer.save_state("ckpt").result().path)
    _step(trainer)
    assert trainer.save_state("ckpt", overwrite=True).result().path == str(path)
    checkpoint = read_checkpoint(str(path), with_optimizer=True)
    assert checkpoint.optim_steps == 1 and params_equal(checkpoint.params, trainer.params)
    assert _hidden_siblings(path) == []


def _failed_overwrite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, fail_when: Callable[[str], bool]
) -> tuple[LocalTrainingClient, Path, Any, list[tuple[str, str]]]:
    """Saves checkpoint "ckpt", takes a step, and overwrites it while `os.replace` fails for the
    sources `fail_when` picks. Returns the trainer, the path, the saved weights and the
    `os.replace` calls (source and destination names)."""
    trainer = micro_trainer(tmp_path)
    path = Path(trainer.save_state("ckpt").result().path)
    old_params = trainer.params
    _step(trainer)
    calls = _fail_replace(monkeypatch, fail_when=fail_when)
    with pytest.raises(OSError, match="injected failure"):
        trainer.save_state("ckpt", overwrite=True)
    monkeypatch.undo()
    return trainer, path, old_params, calls


def test_a_failed_move_into_place_keeps_the_old_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer, path, old_params, calls = _failed_overwrite(
        tmp_path, monkeypatch, fail_when=lambda src: ".tmp-" in src
    )
    assert calls[-1][1] == "ckpt"  # the old one was put back
    checkpoint = read_checkpoint(str(path), with_optimizer=True)
    assert checkpoint.optim_steps == 0 and params_equal(checkpoint.params, old_params)
    assert _hidden_siblings(path) == []
    # Sampler checkpoints (always overwritten) follow the same path.
    sampler_path = Path(trainer.save_weights_for_sampler("s").result().path)
    _fail_replace(monkeypatch, fail_when=lambda src: ".tmp-" in src)
    _step(trainer)
    with pytest.raises(OSError, match="injected failure"):
        trainer.save_weights_for_sampler("s")
    monkeypatch.undo()
    assert read_checkpoint(str(sampler_path), with_optimizer=False).optim_steps == 1


def test_a_crash_between_the_renames_loses_no_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The move-in and the put-back both fail: the state a crash between the renames leaves.
    _, path, old_params, _ = _failed_overwrite(
        tmp_path, monkeypatch, fail_when=lambda src: ".tmp-" in src or ".old-" in src
    )
    (aside,) = [name for name in _hidden_siblings(path) if name.startswith(".ckpt.old-")]
    checkpoint = read_checkpoint(str(path.parent / aside), with_optimizer=True)
    assert checkpoint.optim_steps == 0 and params_equal(checkpoint.params, old_params)
    with pytest.raises(CheckpointError, match="interrupted write") as info:
        read_checkpoint(str(path), with_optimizer=True)
    assert aside in str(info.value)


@pytest.mark.parametrize(
    ("error", "raised", "message"),
    [
        (OSError("injected: disk full"), OSError, "injected: disk full"),
        # the disk's own state, whose message names no file: the checkpoint's path is added
        (
            OSError(errno.ENOSPC, "No space left on device"),
            CheckpointError,
            "checkpoint {path}: cannot write it: [Errno 28] No space left on device",
        ),
    ],
    ids=["any-error", "full-disk"],
)
def test_a_failure_while_writing_keeps_the_old_checkpoint(
    error: OSError,
    raised: type[Exception],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trainer = micro_trainer(tmp_path)
    path = Path(trainer.save_state("ckpt").result().path)
    _step(trainer)

    def savez(*args: Any, **kwargs: Any) -> None:
        raise error

    monkeypatch.setattr(np, "savez", savez)
    with pytest.raises(raised) as info:
        trainer.save_state("ckpt", overwrite=True)
    monkeypatch.undo()
    assert str(info.value) == message.format(path=path)
    assert read_checkpoint(str(path), with_optimizer=True).optim_steps == 0
    assert _hidden_siblings(path) == []


def test_a_failed_cleanup_of_the_old_copy_does_not_fail_the_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    trainer = micro_trainer(tmp_path)
    path = Path(trainer.save_state("ckpt").result().path)
    _step(trainer)
    real_rmtree = shutil.rmtree

    def rmtree(target: Any, *args: Any, **kwargs: Any) -> None:
        if ".old-" in Path(target).name:
            raise OSError("injected failure deleting the old copy")
        real_rmtree(target, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    with caplog.at_level(logging.WARNING):
        assert trainer.save_state("ckpt", overwrite=True).result().path == str(path)
    monkeypatch.undo()
    checkpoint = read_checkpoint(str(path), with_optimizer=True)
    assert checkpoint.optim_steps == 1 and params_equal(checkpoint.params, trainer.params)
    (aside,) = [name for name in _hidden_siblings(path) if name.startswith(".ckpt.old-")]
    assert aside in caplog.text and "was not deleted" in caplog.text


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_the_next_save_removes_leftovers_of_killed_writes_only(tmp_path: Path) -> None:
    trainer = micro_trainer(tmp_path)
    path = Path(trainer.save_state("a").result().path)
    parent = path.parent
    hex32 = "0" * 32
    dead, alive = _dead_pid(), os.getppid()
    here = f"@{_HOST}"
    leftovers = {
        f".step_1.tmp-{dead}{here}-{hex32}": True,  # its writer was killed: removed
        f".step_2.tmp-{os.getpid()}{here}-{hex32}": True,  # this process, not in flight: removed
        f".step_3.tmp-{alive}{here}-{hex32}": False,  # a live writer's: kept
        f".step_7.tmp-{dead}@ffffffff-{hex32}": False,  # another host's pid, recent: kept
        f".step_8.tmp-{dead}-{hex32}": True,  # no host tag (this session's first format): here
        f".step_4.tmp-{hex32}": False,  # an earlier rlpure's, recent: kept
        f".step_5.tmp-{hex32}": True,  # an earlier rlpure's, over an hour old: removed
        f".step_6.tmp-{dead}-x": False,  # not this writer's pattern: kept
        f".ckpt.tmp-{dead}-{hex32}": False,  # the new copy of an interrupted overwrite: kept
        ".ckpt.old-" + hex32: False,  # (its old copy; `ckpt` itself is missing)
    }
    for name in leftovers:
        (parent / name).mkdir()
        (parent / name / "arrays.npz").write_bytes(b"partial")
    old = os.stat(parent / f".step_5.tmp-{hex32}").st_mtime - 7200
    os.utime(parent / f".step_5.tmp-{hex32}", (old, old))
    (parent / f".step_9.tmp-{alive}@ffffffff-{hex32}").mkdir()  # another host's, hours old
    os.utime(parent / f".step_9.tmp-{alive}@ffffffff-{hex32}", (old, old))
    leftovers[f".step_9.tmp-{alive}@ffffffff-{hex32}"] = True
    (parent / "not_hidden.tmp-" / "x").mkdir(parents=True)
    trainer.save_state("b").result()
    for name, removed in leftovers.items():
        assert (parent / name).exists() is not removed, name
    assert (parent / "not_hidden.tmp-" / "x").exists()
    assert read_checkpoint(str(path), with_optimizer=True).optim_steps == 0
    assert read_checkpoint(str(parent / "b"), with_optimizer=True).optim_steps == 0


def test_a_run_resumed_elsewhere_sweeps_the_killed_writes_beside_its_checkpoint(
    tmp_path: Path,
) -> None:
    """A resumed run saves into its own run folder, so the next save never looks beside the
    checkpoint it continued: the resume itself removes dead writers' leftovers there."""
    trainer = micro_trainer(tmp_path)
    path = Path(trainer.save_state("a").result().path)
    hex32 = "0" * 32
    killed = path.parent / f".step_2.tmp-{_dead_pid()}@{_HOST}-{hex32}"
    live = path.parent / f".step_3.tmp-{os.getppid()}@{_HOST}-{hex32}"
    for leftover in (killed, live):
        leftover.mkdir()
        (leftover / "arrays.npz").write_bytes(b"partial")
    service = micro_service(tmp_path / "other")
    resumed = service.create_training_client_from_state_with_optimizer(str(path)).result()
    assert not killed.exists() and live.exists()
    saved = Path(resumed.save_state("b").result().path)
    assert saved.parent != path.parent  # its own saves would never have swept there
