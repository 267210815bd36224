"""`LocalSandbox`: a `SandboxInterface` that runs commands as local subprocesses under limits.

Each `run_command` starts `/bin/sh -c <command>` in its own session (process group) in the
sandbox's working directory, with resource limits set before it: address space
(`memory_limit_bytes`, RLIMIT_AS), CPU seconds (RLIMIT_CPU, the timeout rounded up plus one),
file size (RLIMIT_FSIZE), no core files. A small `python -I -S` launcher sets them and `exec`s
the command (`_limits_argv`): no Python code runs between `fork` and `exec` in this process,
which JAX's threads make unsafe (`subprocess`'s `preexec_fn` could deadlock there). A
command still running at its wall-clock `timeout` has its whole process group killed
(SIGKILL) and comes back with `exit_code` 124 and `metrics["timed_out"] = True`; stdout and
stderr are each kept up to `max_output_bytes` (the rest is drained and dropped,
`metrics["output_truncated"] = True`) and decoded as UTF-8 with replacement.

No process outlives its command: where the kernel allows unprivileged user namespaces, the
command runs under `unshare --user --map-root-user --pid --fork --kill-child` (plus `--net`
unless `network=True`), in a fresh PID namespace whose init is the command's shell, so when the
shell exits or is killed every descendant dies with it, even one that left the process group
(`setsid`); `metrics["processes_contained"]` says so. Elsewhere the process group is killed
after every run, and reading the output after a kill waits at most `_DRAIN_SECONDS` (a
descendant that left the group and keeps a pipe open cannot hold the call).

Commands get this process's environment less the allocator variables the `rlpure` script added
for XLA (`rlpure_launch.user_environ`): what the user started `rlpure` with.

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
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from rlpure_launch import user_environ
from shell.sandboxes._interface import SandboxResult, SandboxTerminatedError

__all__ = ["DEFAULT_MAX_OUTPUT_BYTES", "LocalSandbox", "network_namespaces_available"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_OUTPUT_BYTES = 128 * 1024
"""Bytes of stdout and of stderr a result keeps by default (the cookbook's 128 KB)."""

TIMEOUT_EXIT_CODE = 124
"""`exit_code` of a command killed at its timeout (coreutils `timeout`'s)."""

_UNSHARE_USER = ("unshare", "--user", "--map-root-user")
_NET = ("--net",)
_PID = ("--pid", "--fork", "--kill-child")
_CHUNK_BYTES = 65536
_DRAIN_SECONDS = 2.0
"""Longest wait for a killed command's pipes to close before they are closed unread."""


@functools.cache
def _unshare_works(*options: str) -> bool:
    """Whether `unshare --user --map-root-user <options> -- true` succeeds here (probed once)."""
    if shutil.which("unshare") is None:
        return False
    try:
        probe = subprocess.run(
            [*_UNSHARE_USER, *options, "--", "true"], capture_output=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def network_namespaces_available() -> bool:
    """Whether this process may run commands in a fresh network namespace (probed once)."""
    return _unshare_works(*_NET)


def _namespace_prefix(*, isolate_network: bool) -> tuple[tuple[str, ...], bool]:
    """The `unshare` argv prefix of a command and whether it contains all its processes."""
    net = _NET if isolate_network else ()
    if _unshare_works(*net, *_PID):
        return (*_UNSHARE_USER, *net, *_PID, "--"), True
    if net:
        return (*_UNSHARE_USER, *net, "--"), False
    return (), False


_SET_LIMITS_AND_EXEC = """
import os, resource, signal, sys
for name, limit in zip(("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_CORE"), sys.argv[1:5]):
    if limit != "none":
        resource.setrlimit(getattr(resource, name), (int(limit), int(limit)))
for name in ("SIGPIPE", "SIGXFSZ"):  # Python ignores them; an ignored signal survives exec
    signal.signal(getattr(signal, name), signal.SIG_DFL)
try:
    os.execvp(sys.argv[5], sys.argv[5:])
except OSError as error:
    print(f"LocalSandbox: cannot run {sys.argv[5]!r}: {error}", file=sys.stderr)
    os._exit(127)
"""
"""The launcher's program: `argv[1:5]` the limits (bytes, seconds, bytes, bytes; `none`: keep
the inherited one), then the command's argv; SIGPIPE and SIGXFSZ back to their default action
(as `subprocess` restores them), so a write to a closed pipe or past the file-size limit kills
the writer as in a shell; a command that cannot be executed exits 127 after one line."""


@functools.cache
def _python() -> str:
    """The interpreter that runs the launcher: this one, else `python3` on the PATH.

    Raises:
        RuntimeError: neither is known.
    """
    found = sys.executable or shutil.which("python3")
    if not found:
        raise RuntimeError(
            "LocalSandbox: no Python to set the resource limits with (sys.executable is "
            "empty and python3 is not on the PATH)"
        )
    return found


def _limits_argv(
    argv: list[str], memory_limit_bytes: int | None, cpu_seconds: int, file_size_bytes: int
) -> list[str]:
    """`argv` run under the resource limits by a fresh Python (`-I -S`: no site, no user
    environment; ~10 ms) that sets them and `exec`s it, keeping the pid.

    Examples:
        >>> _limits_argv(["true"], None, 3, 10)[5:]
        ['none', '3', '10', '0', 'true']
    """
    memory = "none" if memory_limit_bytes is None else str(memory_limit_bytes)
    limits = [memory, str(cpu_seconds), str(file_size_bytes), "0"]
    return [_python(), "-I", "-S", "-c", _SET_LIMITS_AND_EXEC, *limits, *argv]


class _Capture:
    """The first `limit` bytes read from a pipe and whether more came (kept if reading stops)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept = bytearray()
        self.truncated = False

    async def read_all(self, stream: asyncio.StreamReader) -> None:
        """Reads `stream` to its end, keeping the first `limit` bytes."""
        while chunk := await stream.read(_CHUNK_BYTES):
            room = self.limit - len(self.kept)
            if len(chunk) > room:
                self.truncated = True
            self.kept += chunk[: max(room, 0)]


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
        """Runs `command` with `/bin/sh -c` under the limits; nothing it starts outlives it.

        Returns:
            The result; `exit_code` 124 and `metrics["timed_out"]` on a timeout; when a
            limit's signal killed the command, 128 plus the signal as the shell reports its
            child's (e.g. 137), or minus the signal where the shell itself was killed.
        """
        self._check_alive()
        if not timeout > 0:
            raise ValueError(f"LocalSandbox.run_command: timeout must be > 0, got {timeout}")
        cap = self.max_output_bytes if max_output_bytes is None else max_output_bytes
        isolated = self.network_isolated
        if not self.network and not isolated:
            _warn_no_network_isolation()
        prefix, contained = _namespace_prefix(isolate_network=isolated)
        argv = _limits_argv(
            [*prefix, "/bin/sh", "-c", command],
            self.memory_limit_bytes,
            math.ceil(timeout) + 1,
            self.file_size_limit_bytes,
        )
        cwd = self._path(workdir) if workdir is not None else self._workdir
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.subprocess_exec(
            lambda: _Protocol(loop),
            *argv,
            cwd=cwd,
            env=user_environ(os.environ),  # not the allocator variables `rlpure` added for XLA
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        process = asyncio.subprocess.Process(transport, protocol, loop)
        out, err = _Capture(cap), _Capture(cap)
        try:
            timed_out = await _collect(process, protocol.exited, out, err, timeout)
        finally:  # whatever happened, nothing the command started keeps running
            _kill_group(process.pid)
            transport.close()
        return SandboxResult(
            stdout=out.kept.decode("utf-8", "replace"),
            stderr=err.kept.decode("utf-8", "replace"),
            exit_code=TIMEOUT_EXIT_CODE if timed_out else int(process.returncode or 0),
            metrics={
                "timed_out": timed_out,
                "output_truncated": out.truncated or err.truncated,
                "network_isolated": isolated,
                "processes_contained": contained,
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


class _Protocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's subprocess protocol, with `exited` set when the process itself exits (asyncio's
    `Process.wait` also waits for the pipes to close, which a descendant can hold open)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=_CHUNK_BYTES, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


async def _collect(
    process: asyncio.subprocess.Process,
    exited: asyncio.Future[None],
    out: _Capture,
    err: _Capture,
    timeout: float,
) -> bool:
    """Reads `process`'s stdout and stderr into `out` and `err`; whether it ran past `timeout`.

    When the shell exits, or at `timeout`, its process group is killed (a background child
    does not outlive it); the pipes are then read for at most `_DRAIN_SECONDS` and closed
    unread after that (a descendant that left the group may hold them open): what was read so
    far is kept.
    """
    assert process.stdout is not None and process.stderr is not None  # PIPE
    reads = asyncio.gather(out.read_all(process.stdout), err.read_all(process.stderr))
    timed_out = False
    try:
        await asyncio.wait_for(asyncio.shield(exited), timeout)
    except TimeoutError:
        timed_out = True
    except BaseException:  # cancelled: the caller kills the group
        reads.cancel()
        raise
    _kill_group(process.pid)
    try:
        await asyncio.wait_for(asyncio.shield(reads), _DRAIN_SECONDS)
    except TimeoutError:
        reads.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reads
    with contextlib.suppress(TimeoutError):  # the killed shell itself is reaped at once
        await asyncio.wait_for(asyncio.shield(exited), _DRAIN_SECONDS)
    return timed_out


def _kill_group(pid: int) -> None:
    """SIGKILL to process group `pid` (the command's session), if any of it is left."""
    with contextlib.suppress(ProcessLookupError):  # the group already exited
        os.killpg(pid, signal.SIGKILL)


@functools.cache
def _warn_no_network_isolation() -> None:
    logger.warning(
        "LocalSandbox: unprivileged network namespaces are unavailable (unshare --user --net "
        "failed); commands run with the host's network."
    )
