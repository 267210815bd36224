"""`shell.sandboxes.LocalSandbox`: output capture, timeouts, memory limits, files, no network."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from shell.sandboxes import (
    LocalSandbox,
    SandboxInterface,
    SandboxTerminatedError,
    network_namespaces_available,
)


def test_captures_stdout_stderr_and_exit_code(tmp_path: Path) -> None:
    sandbox = LocalSandbox(workdir=tmp_path)
    assert isinstance(sandbox, SandboxInterface)
    result = asyncio.run(sandbox.run_command("echo out; echo err >&2; pwd; exit 3"))
    assert result.stdout == f"out\n{tmp_path}\n"
    assert result.stderr == "err\n"
    assert result.exit_code == 3
    assert result.metrics["timed_out"] is False


def test_output_is_capped_and_drained() -> None:
    sandbox = LocalSandbox(max_output_bytes=10)
    result = asyncio.run(sandbox.run_command("head -c 1000000 /dev/zero | tr '\\0' x"))
    assert result.stdout == "x" * 10
    assert result.metrics["output_truncated"] is True
    assert result.exit_code == 0
    small = asyncio.run(sandbox.run_command("printf abc", max_output_bytes=2))
    assert small.stdout == "ab"
    asyncio.run(sandbox.cleanup())


def test_a_command_past_its_timeout_is_killed_with_its_children() -> None:
    sandbox = LocalSandbox()
    start = time.monotonic()
    result = asyncio.run(
        sandbox.run_command("echo started; sleep 30 & sleep 30; echo never", timeout=1)
    )
    assert time.monotonic() - start < 5
    assert result.exit_code == 124
    assert result.metrics["timed_out"] is True
    assert result.stdout == "started\n"


def test_memory_limit_makes_allocation_fail() -> None:
    sandbox = LocalSandbox(memory_limit_bytes=256 * 1024 * 1024)
    code = "b = bytearray(1024 * 1024 * 1024); print('allocated')"
    result = asyncio.run(sandbox.run_command(f'{sys.executable} -S -c "{code}"'))
    assert result.exit_code != 0
    assert "MemoryError" in result.stderr
    assert "allocated" not in result.stdout
    fine = asyncio.run(
        sandbox.run_command(f'{sys.executable} -S -c "print(len(bytearray(10**6)))"')
    )
    assert (fine.exit_code, fine.stdout) == (0, "1000000\n")


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
def test_no_network_by_default() -> None:
    # a fresh network namespace holds only its own loopback, whatever the host has
    isolated = asyncio.run(LocalSandbox().run_command("cat /proc/net/dev"))
    assert isolated.metrics["network_isolated"] is True
    assert _interfaces(isolated.stdout) == {"lo"}
    host = asyncio.run(LocalSandbox(network=True).run_command("cat /proc/net/dev"))
    assert host.metrics["network_isolated"] is False
    assert _interfaces(host.stdout) == _interfaces(Path("/proc/net/dev").read_text())
