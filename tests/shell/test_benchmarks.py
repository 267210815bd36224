"""Smoke runs of the benchmark scripts, so they keep working (their figures are not checked)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_bench_assembly_runs_its_small_case(capsys):
    assert _load("bench_assembly").main(["--quick", "--case", "small"]) == 0
    out = capsys.readouterr().out
    assert "rlpure arrays" in out and "speed-up vs" in out and "memcpy floor" in out


@pytest.mark.slow  # five short training runs (~10 s on 2 loaded cores)
def test_bench_loop_runs_every_mode_briefly(capsys):
    module = _load("bench_loop")
    argv = ["--no-cookbook", "--steps", "2", "--groups", "2", "--group-size", "2"]
    argv += ["--minibatches", "2", "--sampling", "0.01", "--train", "0.01"]
    assert module.main(argv) == 0
    out = capsys.readouterr().out
    assert all(mode in out for mode in ("sync", "stream", "async"))


@pytest.mark.slow  # starts rlpure serve and compiles both sides (~30 s on 2 loaded cores)
def test_bench_serve_runs_its_quick_case(capsys):
    assert _load("bench_serve").main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "HTTP / in-process" in out and "tokens/s" in out and "SDK, 1 process" in out
