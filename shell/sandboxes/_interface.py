"""The cookbook's `tinker_cookbook.sandbox.sandbox_interface`: the code-execution sandbox protocol.

`SandboxInterface` is what code-executing tools talk to (run a command, read and write files,
heartbeat, clean up); `SandboxResult` is a command's or file operation's outcome;
`SandboxTerminatedError` says the sandbox is gone. Names, fields and defaults are the cookbook's;
`SandboxResult` is a frozen `msgspec.Struct` (the cookbook's is a `chz` class: keyword
construction and attribute access alike).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import msgspec

from shell.errors import SandboxError

__all__ = ["SandboxInterface", "SandboxResource", "SandboxResult", "SandboxTerminatedError"]


class SandboxResult(msgspec.Struct, frozen=True, kw_only=True):
    """One sandbox operation's outcome.

    Attributes:
        stdout: the command's standard output (a read file's content), possibly truncated.
        stderr: its standard error.
        exit_code: its exit status; 0 is success.
        metrics: diagnostics (for `LocalSandbox`: `timed_out`, `output_truncated`, ...).
    """

    stdout: str
    stderr: str
    exit_code: int
    metrics: dict[str, Any] = msgspec.field(default_factory=dict)


class SandboxTerminatedError(SandboxError):
    """The sandbox was terminated (cleaned up) or died unexpectedly."""


@runtime_checkable
class SandboxInterface(Protocol):
    """A sandbox: `run_command`, `read_file`, `write_file`, `send_heartbeat`, `cleanup`."""

    @property
    def sandbox_id(self) -> str:
        """The sandbox instance's identifier."""
        ...

    async def send_heartbeat(self, timeout: int = 30) -> None:
        """Keeps the sandbox alive (a no-op where nothing expires)."""
        ...

    async def run_command(
        self,
        command: str,
        workdir: str | None = None,
        timeout: int = 60,
        max_output_bytes: int | None = None,
    ) -> SandboxResult:
        """Runs a shell command; `workdir=None` uses the sandbox's default directory."""
        ...

    async def read_file(
        self, path: str, max_bytes: int | None = None, timeout: int = 60
    ) -> SandboxResult:
        """Reads a file (at most `max_bytes` of it) into `stdout`."""
        ...

    async def write_file(
        self, path: str, content: str | bytes, executable: bool = False, timeout: int = 60
    ) -> SandboxResult:
        """Writes a file, executable if asked."""
        ...

    async def cleanup(self) -> None:
        """Releases the sandbox."""
        ...


class SandboxResource:
    """Holds a sandbox and forwards `send_heartbeat` and `cleanup` to it.

    Args:
        sandbox: the sandbox held.
    """

    def __init__(self, sandbox: SandboxInterface) -> None:
        self.sandbox: SandboxInterface = sandbox

    async def send_heartbeat(self, timeout: int = 30) -> None:
        """Forwards a heartbeat."""
        await self.sandbox.send_heartbeat(timeout=timeout)

    async def cleanup(self) -> None:
        """Forwards cleanup."""
        await self.sandbox.cleanup()
