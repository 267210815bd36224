"""`LocalSandbox`: a `SandboxInterface` that runs commands as local subprocesses under limits.

Each `run_command` starts `/bin/sh -c <command>` in its own session (process group) in the
sandbox's working directory, with resource limits set in the child before `exec`
(`resource.setrlimit`): address space (`memory_limit_bytes`, RLIMIT_AS), CPU seconds
(RLIMIT_CPU, the timeout rounded up plus one), file size (RLIMIT_FSIZE), no core files. A
command still running at its wall-clock `timeout` has its whole process group killed
(SIGKILL) and comes back with `exit_code` 124 and `metrics["timed_out"] = True`; stdout and
stderr are each kept up to `max_output_bytes` (the rest is drained and dropped,
`metrics["output_truncated"] = True`) and decoded as UTF-8 with replacement.

What is and is not enforced (Linux, no container):
- Network: with `network=False` (the default) commands run under
  `unshare --user --map-root-user --net`, a fresh network namespace with only a down loopback,
  when the kernel allows unprivileged user namespaces (probed once per process); otherwise
  they run with the host's network and `metrics["network_isolated"]` is False (a warning is
  logged once). `metrics["network_isolated"]` says which on every result.
- Memory and CPU are enforced by the kernel through the rlimits (a process over its address
  space limit sees allocations fail: Python raises `MemoryError`); the limits apply per process,
  so a command that forks many children can use more in total.
- Not enforced: filesystem isolation (commands run as the same user and can read and write
  whatever that user can; the working directory is only the default), process count, and
  anything a setuid program could do. Use a container sandbox (the cookbook's SandboxFusion or
  Modal backends) for untrusted code at scale.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import resource
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from shell.sandboxes._interface import SandboxResult, SandboxTerminatedError

__all__ = ["DEFAULT_MAX_OUTPUT_BYTES", "LocalSandbox", "network_namespaces_available"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_OUTPUT_BYTES = 128 * 1024
"""Bytes of stdout and of stderr a result keeps by default (the cookbook's 128 KB)."""

TIMEOUT_EXIT_CODE = 124
"""`exit_code` of a command killed at its timeout (coreutils `timeout`'s)."""

_UNSHARE_NET = ("unshare", "--user", "--map-root-user", "--net", "--")
_CHUNK_BYTES = 65536


@functools.cache
def network_namespaces_available() -> bool:
    """Whether this process may run commands in a fresh network namespace (probed once)."""
    if shutil.which("unshare") is None:
        return False
    try:
        probe = subprocess.run([*_UNSHARE_NET, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def _limit_child(memory_limit_bytes: int | None, cpu_seconds: int, file_size_bytes: int) -> None:
    """Runs in the child between fork and exec: the resource limits."""
    if memory_limit_bytes is not None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_bytes, file_size_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


async def _read_capped(stream: asyncio.StreamReader, limit: int) -> tuple[bytes, bool]:
    """All of `stream`, keeping the first `limit` bytes; `(kept, truncated)`."""
    kept = bytearray()
    truncated = False
    while chunk := await stream.read(_CHUNK_BYTES):
        room = limit - len(kept)
        if len(chunk) > room:
            truncated = True
        kept += chunk[: max(room, 0)]
    return bytes(kept), truncated


class LocalSandbox:
    """A local subprocess sandbox with time and memory limits (see the module docstring).

    Args:
        workdir: the default working directory; None: a fresh temporary directory, removed by
            `cleanup`.
        memory_limit_bytes: address-space limit of each process; None: no limit.
        file_size_limit_bytes: largest file a command may write.
        max_output_bytes: default cap on stdout and on stderr of each result.
        network: whether commands may use the network; False isolates them when possible.
    """

    def __init__(
        self,
        *,
        workdir: str | os.PathLike[str] | None = None,
        memory_limit_bytes: int | None = 1024 * 1024 * 1024,
        file_size_limit_bytes: int = 256 * 1024 * 1024,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        network: bool = False,
    ) -> None:
        if memory_limit_bytes is not None and memory_limit_bytes <= 0:
            raise ValueError(
                f"LocalSandbox.memory_limit_bytes: expected > 0 or None, got {memory_limit_bytes}"
            )
        if max_output_bytes <= 0:
            raise ValueError(f"LocalSandbox.max_output_bytes: expected > 0, got {max_output_bytes}")
        self._owns_workdir = workdir is None
        self._workdir = Path(
            tempfile.mkdtemp(prefix="rlpure-sandbox-") if workdir is None else workdir
        )
        self.memory_limit_bytes = memory_limit_bytes
        self.file_size_limit_bytes = file_size_limit_bytes
        self.max_output_bytes = max_output_bytes
        self.network = network
        self._terminated = False

    @property
    def sandbox_id(self) -> str:
        """The working directory's path."""
        return str(self._workdir)

    @property
    def network_isolated(self) -> bool:
        """Whether commands run without network access."""
        return not self.network and network_namespaces_available()

    def _check_alive(self) -> None:
        if self._terminated:
            raise SandboxTerminatedError(f"LocalSandbox {self.sandbox_id}: already cleaned up")

    def _path(self, path: str) -> Path:
        return self._workdir / path  # an absolute `path` stays itself

    async def send_heartbeat(self, timeout: int = 30) -> None:
        """A no-op: a local sandbox does not expire."""
        self._check_alive()

    async def run_command(
        self,
        command: str,
        workdir: str | None = None,
        timeout: int = 60,
        max_output_bytes: int | None = None,
    ) -> SandboxResult:
        """Runs `command` with `/bin/sh -c` under the limits; kills its process group at `timeout`.

        Returns:
            The result; `exit_code` 124 and `metrics["timed_out"]` on a timeout, a negative
            `exit_code` (minus the signal) when a limit's signal killed it (e.g. -9, -24).
        """
        self._check_alive()
        if not timeout > 0:
            raise ValueError(f"LocalSandbox.run_command: timeout must be > 0, got {timeout}")
        cap = self.max_output_bytes if max_output_bytes is None else max_output_bytes
        isolated = self.network_isolated
        if not self.network and not isolated:
            _warn_no_network_isolation()
        argv = [*(_UNSHARE_NET if isolated else ()), "/bin/sh", "-c", command]
        cwd = self._path(workdir) if workdir is not None else self._workdir
        limits = functools.partial(
            _limit_child,
            self.memory_limit_bytes,
            math.ceil(timeout) + 1,
            self.file_size_limit_bytes,
        )
        process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            preexec_fn=limits,
        )
        assert process.stdout is not None and process.stderr is not None  # PIPE above
        reads = asyncio.gather(
            _read_capped(process.stdout, cap), _read_capped(process.stderr, cap), process.wait()
        )
        timed_out = False
        try:
            (out, out_cut), (err, err_cut), _ = await asyncio.wait_for(
                asyncio.shield(reads), timeout
            )
        except TimeoutError:
            timed_out = True
            _kill_group(process.pid)
            (out, out_cut), (err, err_cut), _ = await reads
        except BaseException:  # cancelled: leave nothing running
            _kill_group(process.pid)
            raise
        return SandboxResult(
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            exit_code=TIMEOUT_EXIT_CODE if timed_out else int(process.returncode or 0),
            metrics={
                "timed_out": timed_out,
                "output_truncated": out_cut or err_cut,
                "network_isolated": isolated,
            },
        )

    async def read_file(
        self, path: str, max_bytes: int | None = None, timeout: int = 60
    ) -> SandboxResult:
        """Reads `path` (relative to the working directory) as UTF-8 into `stdout`."""
        self._check_alive()
        try:
            with self._path(path).open("rb") as f:
                data = f.read() if max_bytes is None else f.read(max_bytes)
        except OSError as e:
            return SandboxResult(stdout="", stderr=f"read_file {path}: {e}", exit_code=1)
        return SandboxResult(stdout=data.decode("utf-8", "replace"), stderr="", exit_code=0)

    async def write_file(
        self, path: str, content: str | bytes, executable: bool = False, timeout: int = 60
    ) -> SandboxResult:
        """Writes `content` to `path` (relative to the working directory), making parents."""
        self._check_alive()
        target = self._path(path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content.encode() if isinstance(content, str) else content)
            if executable:
                target.chmod(target.stat().st_mode | 0o111)
        except OSError as e:
            return SandboxResult(stdout="", stderr=f"write_file {path}: {e}", exit_code=1)
        return SandboxResult(stdout="", stderr="", exit_code=0)

    async def cleanup(self) -> None:
        """Marks the sandbox terminated and removes its temporary working directory."""
        self._terminated = True
        if self._owns_workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group already exited
        os.killpg(pid, signal.SIGKILL)


@functools.cache
def _warn_no_network_isolation() -> None:
    logger.warning(
        "LocalSandbox: unprivileged network namespaces are unavailable (unshare --user --net "
        "failed); commands run with the host's network."
    )
