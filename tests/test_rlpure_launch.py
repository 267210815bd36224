"""The `rlpure` console script starts its command with glibc's allocator variables set
(`rlpure_launch`): user values win, other C libraries run as they are, and a real `rlpure serve`
process, started again under its own process id, runs with them."""

from __future__ import annotations

import doctest
import os
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

import rlpure_launch as launch
from rlpure_launch import ADDED_VARIABLE, ALLOCATOR_ENVIRON, allocator_environ, user_environ
from tests.serve.server import running_server


def test_doctests() -> None:
    result = doctest.testmod(launch)
    assert result.attempted and not result.failed


def test_the_missing_variables_are_added_and_the_users_win() -> None:
    environ = allocator_environ({"PATH": "/bin", "MALLOC_ARENA_MAX": "8"}, "glibc")
    assert environ == {
        **ALLOCATOR_ENVIRON,
        "PATH": "/bin",
        "MALLOC_ARENA_MAX": "8",
        ADDED_VARIABLE: "MALLOC_MMAP_MAX_,MALLOC_TRIM_THRESHOLD_",
    }
    assert allocator_environ(environ, "glibc") is None  # started again: nothing left to add
    # what the run starts for the user gets the user's environment back, their own value kept
    assert user_environ(environ) == {"PATH": "/bin", "MALLOC_ARENA_MAX": "8"}


def test_rlpure_malloc_default_keeps_glibcs_defaults() -> None:
    assert allocator_environ({"RLPURE_MALLOC": "default"}, "glibc") is None


@pytest.mark.parametrize("libc", ["", "musl"])
def test_other_c_libraries_run_as_they_are(libc: str) -> None:
    assert allocator_environ({"PATH": "/bin"}, libc) is None


def test_importing_the_launcher_loads_neither_shell_nor_jax() -> None:
    """The restart must come before the project's imports, or they run twice."""
    code = "import sys, rlpure_launch; print(sorted({'shell', 'jax'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.fixture
def execs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Sequence[str], Mapping[str, str]]]:
    """`os.execve` calls recorded instead of made, with the allocator variables unset and
    glibc as the C library."""
    calls: list[tuple[str, Sequence[str], Mapping[str, str]]] = []
    monkeypatch.setattr(os, "execve", lambda *args: calls.append(args))
    monkeypatch.setattr(platform, "libc_ver", lambda: ("glibc", "2.36"))
    for name in ALLOCATOR_ENVIRON:
        monkeypatch.delenv(name, raising=False)
    return calls


def test_the_command_starts_again_with_its_own_interpreter_and_arguments(
    execs: list[tuple[str, Sequence[str], Mapping[str, str]]],
) -> None:
    launch.start_with_allocator_environ()
    [(executable, argv, environ)] = execs
    assert (executable, argv) == (sys.executable, sys.orig_argv)
    assert {name: environ[name] for name in ALLOCATOR_ENVIRON} == ALLOCATOR_ENVIRON


@pytest.mark.parametrize("program", ["", "-"], ids=["interactive", "standard input"])
def test_a_program_read_from_standard_input_is_not_started_again(
    execs: list[tuple[str, Sequence[str], Mapping[str, str]]],
    monkeypatch: pytest.MonkeyPatch,
    program: str,
) -> None:
    monkeypatch.setattr(sys, "argv", [program])
    launch.start_with_allocator_environ()
    assert execs == []


def test_a_failed_restart_runs_the_command_with_glibcs_defaults(
    execs: list[tuple[str, Sequence[str], Mapping[str, str]]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def fail(*args: object) -> None:
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(os, "execve", fail)
    launch.start_with_allocator_environ()  # returns
    assert capsys.readouterr().err.startswith("rlpure: running with glibc's default allocator")


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
