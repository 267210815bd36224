"""`shell.sandboxes.LocalSandbox`: output capture, timeouts, memory limits, files, no network."""

from __future__ import annotations

import asyncio
import doctest
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rlpure_launch import ADDED_VARIABLE
from shell.sandboxes import (
    LocalSandbox,
    SandboxInterface,
    SandboxTerminatedError,
    _local,
    network_namespaces_available,
)

MakeSandbox = Callable[..., LocalSandbox]


@pytest.fixture
def make_sandbox() -> Iterator[MakeSandbox]:
    """`LocalSandbox(**options)`, each cleaned up after the test (no temporary folder left)."""
    made: list[LocalSandbox] = []

    def make(**options: Any) -> LocalSandbox:
        made.append(LocalSandbox(**options))
        return made[-1]

    yield make
    for sandbox in made:
        asyncio.run(sandbox.cleanup())


def test_doctests() -> None:
    result = doctest.testmod(_local)
    assert result.attempted and not result.failed


def test_captures_stdout_stderr_and_exit_code(tmp_path: Path) -> None:
    sandbox = LocalSandbox(workdir=tmp_path)
    assert isinstance(sandbox, SandboxInterface)
    result = asyncio.run(sandbox.run_command("echo out; echo err >&2; pwd; exit 3"))
    assert result.stdout == f"out\n{tmp_path}\n"
    assert result.stderr == "err\n"
    assert result.exit_code == 3
    assert result.metrics["timed_out"] is False


def test_output_is_capped_and_drained(make_sandbox: MakeSandbox) -> None:
    sandbox = make_sandbox(max_output_bytes=10)
    result = asyncio.run(sandbox.run_command("head -c 1000000 /dev/zero | tr '\\0' x"))
    assert result.stdout == "x" * 10
    assert result.metrics["output_truncated"] is True
    assert result.exit_code == 0
    small = asyncio.run(sandbox.run_command("printf abc", max_output_bytes=2))
    assert small.stdout == "ab"
    asyncio.run(sandbox.cleanup())


def test_a_command_past_its_timeout_is_killed_with_its_children(make_sandbox: MakeSandbox) -> None:
    sandbox = make_sandbox()
    start = time.monotonic()
    result = asyncio.run(
        sandbox.run_command("echo started; sleep 30 & sleep 30; echo never", timeout=1)
    )
    assert time.monotonic() - start < 5
    assert result.exit_code == 124
    assert result.metrics["timed_out"] is True
    assert result.stdout == "started\n"


def test_memory_limit_makes_allocation_fail(make_sandbox: MakeSandbox) -> None:
    sandbox = make_sandbox(memory_limit_bytes=256 * 1024 * 1024)
    code = "b = bytearray(1024 * 1024 * 1024); print('allocated')"
    result = asyncio.run(sandbox.run_command(f'{sys.executable} -S -c "{code}"'))
    assert result.exit_code != 0
    assert "MemoryError" in result.stderr
    assert "allocated" not in result.stdout
    fine = asyncio.run(
        sandbox.run_command(f'{sys.executable} -S -c "print(len(bytearray(10**6)))"')
    )
    assert (fine.exit_code, fine.stdout) == (0, "1000000\n")


def _limits(text: str) -> dict[str, str]:
    """`/proc/<pid>/limits`' soft limit per resource name ("Max cpu time": "3")."""
    return {line[:26].strip(): line[26:].split()[0] for line in text.splitlines()[1:]}


@pytest.mark.skipif(not Path("/proc/self/limits").exists(), reason="needs Linux /proc")
def test_every_limit_reaches_the_command_exactly(make_sandbox: MakeSandbox) -> None:
    sandbox = make_sandbox(memory_limit_bytes=300_000_000, file_size_limit_bytes=12_345)
    result = asyncio.run(sandbox.run_command("cat /proc/self/limits", timeout=3))
    assert result.exit_code == 0, result.stderr
    limits = _limits(result.stdout)
    assert limits["Max address space"] == "300000000"
    assert limits["Max cpu time"] == "4"  # the timeout plus one
    assert limits["Max file size"] == "12345"
    assert limits["Max core file size"] == "0"
    unlimited = make_sandbox(memory_limit_bytes=None)
    inherited = _limits(Path("/proc/self/limits").read_text())["Max address space"]
    result = asyncio.run(unlimited.run_command("cat /proc/self/limits"))
    assert _limits(result.stdout)["Max address space"] == inherited


def test_a_write_past_the_size_limit_is_killed_by_sigxfsz_and_the_file_cut_there(
    make_sandbox: MakeSandbox,
) -> None:
    sandbox = make_sandbox(file_size_limit_bytes=4096)
    command = "head -c 10000 /dev/zero > big; echo $?; wc -c < big"
    result = asyncio.run(sandbox.run_command(command))
    assert result.exit_code == 0
    assert result.stdout.split() == [str(128 + signal.SIGXFSZ), "4096"]


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_commands_start_with_sigpipe_and_sigxfsz_not_ignored_and_a_closed_pipe_stops_its_writer(
    make_sandbox: MakeSandbox,
) -> None:
    sandbox = make_sandbox()
    status = asyncio.run(sandbox.run_command("grep SigIgn /proc/self/status"))
    ignored = int(status.stdout.split()[1], 16)  # bit n - 1: signal n (the parent's own stay)
    for number in (signal.SIGPIPE, signal.SIGXFSZ):
        assert not ignored & 1 << (number - 1), number
    start = time.monotonic()
    endless = asyncio.run(sandbox.run_command("while :; do echo y; done | head -1", timeout=20))
    assert (endless.exit_code, endless.stdout) == (0, "y\n")  # SIGPIPE ended the loop
    assert time.monotonic() - start < 10


def test_a_command_that_cannot_be_executed_exits_127_with_one_line(tmp_path: Path) -> None:
    argv = _local._limits_argv([str(tmp_path / "missing")], None, 5, 1 << 20)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 127
    assert done.stderr.startswith("LocalSandbox: cannot run") and done.stderr.count("\n") == 1


def test_commands_get_the_users_environment_not_the_allocator_variables_rlpure_added(
    make_sandbox: MakeSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rlpure` starts itself again with glibc's allocator variables for XLA
    (`rlpure_launch`); the user's code in the sandbox runs in the user's environment."""
    monkeypatch.setenv("MALLOC_ARENA_MAX", "1")  # added by the restart
    monkeypatch.setenv("MALLOC_MMAP_MAX_", "7")  # the user's own
    monkeypatch.setenv(ADDED_VARIABLE, "MALLOC_ARENA_MAX")
    monkeypatch.setenv("RLPURE_TEST_MARK", "kept")
    result = asyncio.run(make_sandbox().run_command("env"))
    environ = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert environ["RLPURE_TEST_MARK"] == "kept" and environ["MALLOC_MMAP_MAX_"] == "7"
    assert "MALLOC_ARENA_MAX" not in environ and ADDED_VARIABLE not in environ


def test_no_python_runs_in_this_process_between_fork_and_exec(make_sandbox: MakeSandbox) -> None:
    """`preexec_fn` runs the interpreter's before-fork hooks (JAX's warns that a deadlock is
    likely, its threads holding locks the child needs); a command must start without them."""
    forks: list[int] = []
    os.register_at_fork(before=lambda: forks.append(1))  # stays registered: only counts
    result = asyncio.run(make_sandbox().run_command("echo ran"))
    assert (result.exit_code, result.stdout) == (0, "ran\n")
    assert forks == []


def test_files_round_trip_and_cleanup_terminates() -> None:
    sandbox = LocalSandbox()
    workdir = Path(sandbox.sandbox_id)
    assert (
        asyncio.run(sandbox.write_file("sub/run.sh", "echo hi\n", executable=True)).exit_code == 0
    )
    assert asyncio.run(sandbox.run_command("./sub/run.sh")).stdout == "hi\n"
    assert asyncio.run(sandbox.read_file("sub/run.sh", max_bytes=4)).stdout == "echo"
    missing = asyncio.run(sandbox.read_file("nope.txt"))
    assert missing.exit_code == 1 and "nope.txt" in missing.stderr
    asyncio.run(sandbox.cleanup())
    assert not workdir.exists()
    with pytest.raises(SandboxTerminatedError, match="already cleaned up"):
        asyncio.run(sandbox.run_command("true"))


def _interfaces(listing: str) -> set[str]:
    return {line.split(":")[0].strip() for line in listing.splitlines()[2:]}


@pytest.mark.skipif(not network_namespaces_available(), reason="no unprivileged user namespaces")
def test_no_network_by_default(make_sandbox: MakeSandbox) -> None:
    # a fresh network namespace holds only its own loopback, whatever the host has
    isolated = asyncio.run(make_sandbox().run_command("cat /proc/net/dev"))
    assert isolated.metrics["network_isolated"] is True
    assert _interfaces(isolated.stdout) == {"lo"}
    host = asyncio.run(make_sandbox(network=True).run_command("cat /proc/net/dev"))
    assert host.metrics["network_isolated"] is False
    assert _interfaces(host.stdout) == _interfaces(Path("/proc/net/dev").read_text())


def _alive(marker: str) -> list[int]:
    """Pids of this machine's processes whose command line contains `marker`."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, UnicodeDecodeError):
            continue
        if entry.name.isdigit() and marker in cmdline:
            pids.append(int(entry.name))
    return pids


def _gone(marker: str, *, within: float = 3.0) -> bool:
    deadline = time.monotonic() + within
    while _alive(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture(params=["namespace", "group only"])
def containment(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each way of ending a command's processes: its PID namespace, or (where the kernel has no
    unprivileged user namespaces) its process group alone."""
    if request.param == "group only":
        monkeypatch.setattr(_local, "_namespace_prefix", lambda **_: ((), False))
    elif not _local._unshare_works(*_local._PID):
        pytest.skip("no unprivileged PID namespaces")
    return str(request.param)


def test_no_process_outlives_a_command_that_exits_normally(
    make_sandbox: MakeSandbox, containment: str
) -> None:
    """A background child dies when the command ends; in a PID namespace, so does a `setsid`
    grandchild (its own session, out of the process group)."""
    code = (
        "import subprocess; subprocess.Popen(['sleep', '771']); "
        "subprocess.Popen(['setsid', 'sleep', '772'], stdout=subprocess.DEVNULL, "
        "stderr=subprocess.DEVNULL); print('spawned')"
    )
    result = asyncio.run(make_sandbox().run_command(f'{sys.executable} -S -c "{code}"', timeout=10))
    assert result.stdout == "spawned\n" and result.exit_code == 0, result
    assert result.metrics["processes_contained"] is (containment == "namespace")
    assert _gone("sleep 771"), _alive("sleep 771")
    if containment == "namespace":
        assert _gone("sleep 772"), _alive("sleep 772")
    else:  # documented: a new session escapes the group kill
        for pid in _alive("sleep 772"):
            os.kill(pid, signal.SIGKILL)


def test_a_timeout_is_not_held_by_a_grandchild_keeping_stdout_open(
    make_sandbox: MakeSandbox, containment: str
) -> None:
    """A `setsid` grandchild escapes the process group and keeps stdout open: the run still ends
    within a bounded time after its timeout, keeping what was printed."""
    start = time.monotonic()
    result = asyncio.run(
        make_sandbox().run_command("echo started; setsid sleep 773 & sleep 30", timeout=1)
    )
    assert time.monotonic() - start < 1 + 2 * _local._DRAIN_SECONDS + 2
    assert result.exit_code == 124 and result.metrics["timed_out"] is True
    assert result.stdout == "started\n", result
    if containment == "namespace":
        assert _gone("sleep 773"), _alive("sleep 773")
    else:
        for pid in _alive("sleep 773"):
            os.kill(pid, signal.SIGKILL)
