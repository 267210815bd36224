"""The catalogue of user errors (issue 12): each ends in one stderr line, exit 2 or 1, no traceback.

Every case runs `python -m shell.cli` as a subprocess bounded by a timeout (a hang is a
failure), on the fake backend or with options refused before anything compiles.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GSM8K_DIR = REPO.parent / "shared" / "data" / "gsm8k"


def _rlpure(
    argv: list[str], cwd: Path, *, env: dict[str, str] | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "shell.cli", *argv],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _one_line_error(done: subprocess.CompletedProcess[str], code: int, needle: str) -> None:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("rlpure: ") and needle in lines[0], lines[0]


FAKE = ["train", "toy", "--backend", "fake"]

CASES: dict[str, tuple[list[str], int, str]] = {
    "binary config": ([*FAKE, "--config", "bin.toml"], 2, "not UTF-8"),
    "huge seed": ([*FAKE, "--seed", "99999999999999999999"], 2, "TrainConfig.seed"),
    "log dir is a file": ([*FAKE, "--log-dir", "afile"], 2, "--log-dir afile"),
    "log dir unwritable": ([*FAKE, "--log-dir", "/proc/rlpure/x"], 2, "--log-dir /proc"),
    "local max tokens": (
        ["train", "toy", "--backend", "local", "--max-tokens", "100000"],
        2,
        "TrainConfig.max_tokens",
    ),
    "toy group size 0": ([*FAKE, "--group-size", "0"], 2, "--group-size"),
    "toy groups per batch -1": ([*FAKE, "--groups-per-batch", "-1"], 2, "--groups-per-batch"),
    "toy groups per batch 0": ([*FAKE, "--groups-per-batch", "0"], 2, "--groups-per-batch"),
    "toy num batches 0": ([*FAKE, "--num-batches", "0"], 2, "--num-batches"),
    "toy env latency nan": ([*FAKE, "--env-latency", "nan"], 2, "--env-latency"),
    "unknown config key": ([*FAKE, "--config", "unknown.toml"], 2, "unknown field"),
    "demo groups per batch 0": (["demo", "--groups-per-batch", "0"], 2, "--groups-per-batch"),
    "demo rl steps -1": (["demo", "--rl-steps", "-1"], 2, "max_steps"),
    "demo rl lr nan": (["demo", "--rl-lr", "nan"], 2, "learning_rate"),
    "toy demo groups per batch 0": (
        ["demo", "--model", "toy", "--groups-per-batch", "0"],
        2,
        "groups_per_batch",
    ),
    "toy demo rl steps -1": (["demo", "--model", "toy", "--rl-steps", "-1"], 2, "rl_steps"),
    "toy demo rl lr nan": (["demo", "--model", "toy", "--rl-lr", "nan"], 2, "rl_lr"),
    "demo pretrain steps without toy": (
        ["demo", "--pretrain-steps", "5"],
        2,
        "--pretrain-steps: only with --model toy",
    ),
    "demo huge seed": (["demo", "--seed", "99999999999999999999"], 2, "--seed"),
    "demo log dir is a file": (["demo", "--log-dir", "afile"], 2, "--log-dir afile"),
    "gsm8k format coef inf": (
        ["train", "gsm8k", "--backend", "local", "--format-coef", "inf", "--data-dir", "gsm"],
        2,
        "--format-coef",
    ),
    "tinker key without tml-": (
        ["train", "toy", "--backend", "tinker", "--max-steps", "1"],
        1,
        "TINKER_API_KEY",
    ),
}


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "bin.toml").write_bytes(bytes(range(256)))
    (tmp_path / "unknown.toml").write_text("no_such_option = 1\n")
    (tmp_path / "afile").write_text("")
    (tmp_path / "gsm").mkdir()
    return tmp_path


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_user_error_is_one_line_and_an_exit_code(workdir: Path, case: str) -> None:
    argv, code, needle = CASES[case]
    done = _rlpure(argv, workdir, env={"TINKER_API_KEY": "not-a-tinker-key"})
    _one_line_error(done, code, needle)


@pytest.mark.slow
@pytest.mark.parametrize("empty", ["train", "test"])
def test_an_empty_gsm8k_file_is_a_data_error_not_a_hang(tmp_path: Path, empty: str) -> None:
    if not (GSM8K_DIR / "test.jsonl").is_file():
        pytest.skip(f"GSM8K data folder {GSM8K_DIR} is absent")
    data = tmp_path / "e"
    data.mkdir()
    for split in ("train", "test"):
        source = (GSM8K_DIR / f"{split}.jsonl").read_text().splitlines(keepends=True)[:8]
        (data / f"{split}.jsonl").write_text("" if split == empty else "".join(source))
    argv = ["train", "gsm8k", "--backend", "local", "--data-dir", str(data), "--max-steps", "1",
            "--cache-dir", str(tmp_path / "hf")]  # fmt: skip
    done = _rlpure(argv, tmp_path, timeout=120)
    # `datasets` prints progress bars on stderr; the error is the last line.
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "Gsm8kDataError" in last and f"{empty}.jsonl" in last and "has no rows" in last


@pytest.mark.slow
def test_an_unreachable_tinker_service_is_reported_within_seconds(tmp_path: Path) -> None:
    """The SDK keeps retrying (its own policy); the console says so at its first retry."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TINKER_API_KEY": "tml-unreachable-test",
        "TINKER_BASE_URL": "http://127.0.0.1:9",  # discard port: nothing listens there
    }
    argv = [sys.executable, "-m", "shell.cli", "train", "toy", "--backend", "tinker",
            "--log-dir", str(tmp_path / "run"), "--max-steps", "1"]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    warned = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for x in proc.stderr:
            lines.append(x)
            if "WARNING" in x:
                warned.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    # Stop at the first warning (or after 25 s): the SDK would go on retrying, as it should.
    warned.wait(timeout=25)
    proc.kill()
    proc.wait(timeout=30)
    reader.join(timeout=30)
    stderr = "".join(lines)
    line = next((x for x in stderr.splitlines() if "WARNING" in x), "")
    assert "Traceback" not in stderr, stderr
    assert "WARNING" in line and "127.0.0.1:9" in line and "retrying" in line, line
    assert "TINKER_BASE_URL" in line
