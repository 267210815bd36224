"""The `rlpure` console script starts its command with glibc's allocator variables set
(`shell.launch`): user values win, other C libraries run as they are, and a real `rlpure serve`
process, started again under its own process id, runs with them."""

from __future__ import annotations

import doctest
import platform
from pathlib import Path

import pytest

from shell import launch
from shell.launch import ALLOCATOR_ENVIRON, allocator_environ
from tests.serve.server import running_server


def test_doctests() -> None:
    result = doctest.testmod(launch)
    assert result.attempted and not result.failed


def test_the_missing_variables_are_added_and_the_users_win() -> None:
    environ = allocator_environ({"PATH": "/bin", "MALLOC_ARENA_MAX": "8"}, "glibc")
    assert environ == {**ALLOCATOR_ENVIRON, "PATH": "/bin", "MALLOC_ARENA_MAX": "8"}
    assert allocator_environ(environ, "glibc") is None  # started again: nothing left to add


def test_rlpure_malloc_default_keeps_glibcs_defaults() -> None:
    assert allocator_environ({"RLPURE_MALLOC": "default"}, "glibc") is None


@pytest.mark.parametrize("libc", ["", "musl"])
def test_other_c_libraries_run_as_they_are(libc: str) -> None:
    assert allocator_environ({"PATH": "/bin"}, libc) is None


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator only")
def test_rlpure_serve_runs_with_the_allocator_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ALLOCATOR_ENVIRON:
        monkeypatch.delenv(name, raising=False)
    with running_server(tmp_path / "state") as server:
        raw = Path(f"/proc/{server.process.pid}/environ").read_bytes()
        environ = dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)
        assert {name: environ.get(name) for name in ALLOCATOR_ENVIRON} == ALLOCATOR_ENVIRON
