"""A log directory has one writer (an OS lock, never stale) and can be moved but not half-copied."""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from shell.config import TrainConfig, build_config
from shell.errors import CheckpointError, ConfigError
from shell.fakes import (
    FakeCheckpointStore,
    FakeServiceClient,
    ScriptedDataset,
    ScriptedEnv,
    ScriptedGroupBuilder,
)
from shell.training import (
    CHECKPOINTS_FILE,
    LOCK_FILE,
    LogDirLockedError,
    TrainResult,
    hold_log_dir,
    read_jsonl,
    train,
)
from tests.local.micro import MICRO_NAME, micro_service

REPO = Path(__file__).resolve().parents[2]


def _config(log_dir: Path, **options: Any) -> TrainConfig:
    return build_config(
        {"log_dir": str(log_dir), "backend": "fake", "progress": False, "max_tokens": 4},
        options,
    )


def _dataset(num_batches: int) -> ScriptedDataset:
    def builder(batch: int, problem: int) -> ScriptedGroupBuilder:
        target = 3 + (batch + problem) % 5
        return ScriptedGroupBuilder(
            lambda _: ScriptedEnv(
                prompt=[1, target], reward_fn=lambda a: float((a == target).mean())
            ),
            group_size=2,
        )

    return ScriptedDataset(builder, num_batches=num_batches, groups_per_batch=2)


def _snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` with its bytes (the lock file's pid included)."""
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


def _holder(log_dir: Path) -> subprocess.Popen[bytes]:
    """A real `rlpure train toy` on `log_dir` that runs long (slow envs), started and locked."""
    process = subprocess.Popen(
        [
            sys.executable, "-m", "shell.cli", "train", "toy", "--backend", "fake",
            "--log-dir", str(log_dir), "--num-batches", "1000", "--env-latency", "0.2",
            "--save-every", "1", "--no-progress",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    # the holder is locked once it has written its pid, and has written a step once
    # metrics.jsonl has a line
    while time.monotonic() < deadline:
        lock = log_dir / LOCK_FILE
        metrics = log_dir / "metrics.jsonl"
        if (
            lock.exists()
            and lock.read_text().startswith(f"{process.pid} ")
            and metrics.exists()
            and metrics.read_text().count("\n") >= 1
        ):
            return process
        if process.poll() is not None:
            raise AssertionError(f"holder ended early: {process.stderr.read()!r}")  # type: ignore[union-attr]
        time.sleep(0.1)
    process.kill()
    raise AssertionError("holder never started training")


def _stop(process: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    if process.poll() is None:
        process.send_signal(sig)
    process.wait(timeout=30)
    if process.stderr is not None:
        process.stderr.close()


def test_a_second_run_on_a_held_log_dir_is_refused_and_touches_nothing(tmp_path: Path) -> None:
    log_dir = tmp_path / "run"
    holder = _holder(log_dir)
    try:
        os.kill(holder.pid, signal.SIGSTOP)  # freeze the holder: the dir must not change now
        before = _snapshot(log_dir)
        second = subprocess.run(
            [
                sys.executable, "-m", "shell.cli", "train", "toy", "--backend", "fake",
                "--log-dir", str(log_dir), "--num-batches", "2", "--no-progress",
            ],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in second.stderr, second.stderr
        assert f"pid {holder.pid}" in lines[0] and str(log_dir) in lines[0]
        with pytest.raises(LogDirLockedError, match=rf"pid {holder.pid}\b"):
            asyncio.run(
                train(
                    _config(log_dir),
                    dataset=_dataset(2),
                    service_client=FakeServiceClient(
                        store=FakeCheckpointStore(log_dir / "fake_states.json")
                    ),
                )
            )
        assert _snapshot(log_dir) == before
    finally:
        os.kill(holder.pid, signal.SIGCONT)
        _stop(holder)


def test_kill_9_of_the_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    log_dir = tmp_path / "run"
    holder = _holder(log_dir)
    _stop(holder, signal.SIGKILL)
    assert (log_dir / LOCK_FILE).read_text().startswith(f"{holder.pid} ")  # the file stays
    result = subprocess.run(
        [
            sys.executable, "-m", "shell.cli", "train", "toy", "--backend", "fake",
            "--log-dir", str(log_dir), "--num-batches", "3", "--no-progress",
        ],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (log_dir / LOCK_FILE).read_text().split()[0] != str(holder.pid)


def test_two_trains_in_one_process_on_one_log_dir_one_is_refused(tmp_path: Path) -> None:
    service = FakeServiceClient()

    async def both() -> tuple[TrainResult | BaseException, ...]:
        return await asyncio.gather(
            train(_config(tmp_path), dataset=_dataset(2), service_client=service),
            train(_config(tmp_path), dataset=_dataset(2), service_client=service),
            return_exceptions=True,
        )

    outcomes = asyncio.run(both())
    refused = [o for o in outcomes if isinstance(o, LogDirLockedError)]
    assert len(refused) == 1, outcomes
    assert isinstance(refused[0], ConfigError)
    assert f"pid {os.getpid()}" in str(refused[0])
    # the lock is released when train returns: a later run goes ahead
    later = asyncio.run(train(_config(tmp_path), dataset=_dataset(3), service_client=service))
    assert later.end_step == 3


def test_hold_log_dir_is_re_entrant_for_its_holder(tmp_path: Path) -> None:
    with hold_log_dir(tmp_path) as held:
        assert held == tmp_path.resolve()
        result = asyncio.run(
            train(_config(tmp_path), dataset=_dataset(2), service_client=FakeServiceClient())
        )
        assert result.end_step == 2
    with hold_log_dir(tmp_path):
        # another holder in this process (a context outside this `with`) is refused
        enter = hold_log_dir(tmp_path).__enter__
        with pytest.raises(LogDirLockedError, match=rf"pid {os.getpid()}\b"):
            contextvars.Context().run(enter)


# --- relocatable log dirs ----------------------------------------------------------------------


def _local_run(log_dir: Path, *, max_steps: int) -> TrainResult:
    """A micro-model run on the local backend, its states in `<log_dir>/local_states`."""
    config = build_config(
        {
            "log_dir": str(log_dir),
            "backend": "local",
            "base_model": MICRO_NAME,
            "progress": False,
            "max_tokens": 2,
            "save_every": 1,
            "max_steps": max_steps,
        },
        {},
    )
    return asyncio.run(
        train(
            config,
            dataset=_dataset(4),
            service_client=micro_service(log_dir / "local_states"),
        )
    )


def _recorded_state_paths(log_dir: Path) -> list[str]:
    """The paths rlpure resumes from (`relative_state_path`; the cookbook's `state_path` holds
    the backend's absolute path, for the cookbook's `main`)."""
    lines = (log_dir / CHECKPOINTS_FILE).read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert all(Path(row["state_path"]).is_absolute() for row in rows), rows
    return [row["relative_state_path"] for row in rows]


def test_a_moved_log_dir_resumes_where_it_was(tmp_path: Path) -> None:
    uninterrupted = _local_run(tmp_path / "whole", max_steps=4)
    first = _local_run(tmp_path / "D", max_steps=2)
    assert first.end_step == 2
    paths = _recorded_state_paths(tmp_path / "D")
    assert paths and all(p.startswith("local_states/") for p in paths), paths
    shutil.move(tmp_path / "D", tmp_path / "D2")
    resumed = _local_run(tmp_path / "D2", max_steps=4)
    assert (resumed.start_step, resumed.end_step) == (2, 4)
    assert resumed.checkpoint is not None
    assert Path(resumed.checkpoint.state_path).is_relative_to(tmp_path / "D2")
    # the moved run continues exactly: the same metrics as a run never interrupted
    rewards = [
        [r.get("env/all/reward/total") for r in read_jsonl(d / "metrics.jsonl")]
        for d in (tmp_path / "whole", tmp_path / "D2")
    ]
    assert rewards[0] == rewards[1]
    assert uninterrupted.end_step == 4


def test_a_log_dir_whose_states_are_a_symlink_to_another_disk_resumes(tmp_path: Path) -> None:
    (tmp_path / "big").mkdir()
    (tmp_path / "D").mkdir()
    (tmp_path / "D" / "local_states").symlink_to(tmp_path / "big")
    _local_run(tmp_path / "D", max_steps=2)
    paths = _recorded_state_paths(tmp_path / "D")
    assert paths and all(p.startswith("local_states/") for p in paths), paths
    resumed = _local_run(tmp_path / "D", max_steps=3)
    assert (resumed.start_step, resumed.end_step) == (2, 3)


def test_a_copy_without_its_states_refuses_to_resume(tmp_path: Path) -> None:
    _local_run(tmp_path / "D", max_steps=2)
    shutil.copytree(tmp_path / "D", tmp_path / "D2", ignore=shutil.ignore_patterns("local_states"))
    before = _snapshot(tmp_path / "D2")
    with pytest.raises(
        CheckpointError, match=r"step-2 checkpoint's state .*D2/local_states.* missing"
    ):
        _local_run(tmp_path / "D2", max_steps=4)
    after = _snapshot(tmp_path / "D2")
    after.pop(LOCK_FILE)
    before.pop(LOCK_FILE)
    assert after == before  # nothing written (only the lock file names the refused run)


def test_absolute_records_of_earlier_versions_resume_inside_and_are_refused_outside(
    tmp_path: Path,
) -> None:
    _local_run(tmp_path / "D", max_steps=2)
    log = tmp_path / "D" / CHECKPOINTS_FILE
    root = (tmp_path / "D").resolve()
    legacy = log.read_text().replace('"local_states/', f'"{root}/local_states/')
    log.write_text(legacy)  # what an earlier rlpure wrote
    shutil.copytree(tmp_path / "D", tmp_path / "D2")  # with its states, records naming D's
    # inside the same dir: still resumes
    assert _local_run(tmp_path / "D", max_steps=3).start_step == 2
    # a copy whose records name the original's states: refused, saying how to convert
    with pytest.raises(CheckpointError, match=r"outside the log dir .*sed -i") as refused:
        _local_run(tmp_path / "D2", max_steps=4)
    assert str(root) in str(refused.value)


# --- damaged log files -------------------------------------------------------------------------


def _fake_run(log_dir: Path, *, max_steps: int) -> TrainResult:
    return asyncio.run(
        train(
            _config(log_dir, max_steps=max_steps, save_every=1),
            dataset=_dataset(4),
            service_client=FakeServiceClient(
                store=FakeCheckpointStore(log_dir / "fake_states.json")
            ),
        )
    )


def _damage(path: Path, line: int, text: str) -> None:
    lines = path.read_text().splitlines()
    lines[line - 1] = text
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("file", "line", "text", "message"),
    [
        ("metrics.jsonl", 1, '{"step": 0, "env', r"metrics.jsonl: line 1 is not valid JSON"),
        ("metrics.jsonl", 2, '{"step": "one"}', r"metrics.jsonl: line 2: field 'step': .*'one'"),
        ("samples.jsonl", 1, "[1, 2]", r"samples.jsonl: line 1 is not a JSON object"),
        (
            CHECKPOINTS_FILE,
            2,
            '{"step": 2, "name": "s", "state_path": "fake://x", "rng_key_data": [1, 2, 3]}',
            r"checkpoints.jsonl: line 2: field 'rng_key_data': expected 2 uint32 words.* got 3",
        ),
        (
            CHECKPOINTS_FILE,
            2,
            '{"step": 2, "name": "s", "state_path": "fake://x", "rng_key_data": [1, 4294967296]}',
            r"checkpoints.jsonl: line 2: .*rng_key_data\[1\]",
        ),
        (
            CHECKPOINTS_FILE,
            1,
            '{"step": "one", "name": "s", "state_path": "fake://x", "rng_key_data": [1, 2]}',
            r"checkpoints.jsonl: line 1: Expected `int \| null`, got `str` - at `\$.step`",
        ),
    ],
)
def test_a_damaged_log_file_is_a_checkpoint_error_naming_file_line_and_field(
    tmp_path: Path, file: str, line: int, text: str, message: str
) -> None:
    _fake_run(tmp_path, max_steps=2)
    _damage(tmp_path / file, line, text)
    before = _snapshot(tmp_path)
    with pytest.raises(CheckpointError, match=message):
        _fake_run(tmp_path, max_steps=4)
    after = _snapshot(tmp_path)
    assert {k: v for k, v in after.items() if k != LOCK_FILE} == {
        k: v for k, v in before.items() if k != LOCK_FILE
    }


def test_a_damaged_log_file_is_one_line_from_the_cli(tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "shell.cli", "train", "toy", "--backend", "fake",
        "--log-dir", str(tmp_path), "--num-batches", "3", "--save-every", "1", "--no-progress",
    ]  # fmt: skip
    assert subprocess.run(command, cwd=REPO, capture_output=True, timeout=120).returncode == 0
    _damage(tmp_path / "metrics.jsonl", 1, '{"step": 0, "env')
    record = '{"step": 1, "name": "s", "state_path": "fake://x", "rng_key_data": [1]}'
    _damage(tmp_path / CHECKPOINTS_FILE, 1, record)  # a JAX TypeError before
    command[command.index("3")] = "5"
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    (message,) = result.stderr.strip().splitlines()
    assert "checkpoints.jsonl: line 1: field 'rng_key_data'" in message


def test_a_torn_last_metrics_line_is_still_dropped_on_resume(tmp_path: Path) -> None:
    _fake_run(tmp_path, max_steps=2)
    metrics = tmp_path / "metrics.jsonl"
    assert "final_totals" in read_jsonl(metrics)[-1]  # the finished run's totals row, step 2
    metrics.write_text(metrics.read_text() + '{"step": 2, "env')  # a kill mid-write
    assert _fake_run(tmp_path, max_steps=4).start_step == 2
    # the torn line and the old totals row are dropped; the resumed run writes its own
    rows = read_jsonl(metrics)
    assert [(r["step"], "final_totals" in r) for r in rows] == [
        (0, False), (1, False), (2, False), (3, False), (4, True),
    ]  # fmt: skip


def test_the_cli_takes_the_lock_before_a_recipe_or_the_demo_does_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from shell import cli
    from shell.commands import TrainRecipe, by_name
    from shell.jobs import COMMANDS

    ran: list[str] = []

    def probe(config: TrainConfig, args: argparse.Namespace) -> None:
        ran.append(config.log_dir)

    recipes = by_name([TrainRecipe("probe", "Records that it ran.", probe)])
    demo_dir = tmp_path / "demo"
    with hold_log_dir(tmp_path), hold_log_dir(demo_dir):
        # A fresh context: not this holder, so refused like another run.
        argv = ["train", "probe", "--log-dir", str(tmp_path)]
        code = contextvars.Context().run(cli.main, argv, recipes=recipes)
        demo_argv = ["demo", "--log-dir", str(demo_dir), "--rl-steps", "1", "--quiet"]
        demo_code = contextvars.Context().run(cli.main, demo_argv, commands=COMMANDS)
    assert (code, demo_code) == (2, 2)
    assert ran == []
    assert sorted(p.name for p in demo_dir.iterdir()) == [LOCK_FILE]  # no base model written
    assert capsys.readouterr().err.count(f"pid {os.getpid()}") == 2
