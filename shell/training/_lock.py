"""One writer per log directory: an advisory lock held for a whole `train` call.

Conventions:
- The lock is `fcntl.flock(LOCK_EX | LOCK_NB)` on `<log_dir>/rlpure.lock` (`LOCK_FILE`). The
  operating system releases it when the holding process ends, however it ends (`kill -9`
  included), so a lock is never stale. After locking, the holder writes its pid and host name
  into the file; a refused run reads them back for its message. The file itself stays behind
  (an unlocked file means nothing).
- A refused run touches nothing in the log directory: it opens the lock file without
  truncating it and leaves before anything else is read or written.
- Inside one process the lock is re-entrant for the code that holds it: `hold_log_dir` marks
  the path held in a `contextvars` variable, which tasks and `asyncio.run` started inside the
  `with` block inherit, so a recipe may hold its log dir around `train` (which takes it again).
  Any other holder in the same process (e.g. a second `train` on the same directory started by
  `asyncio.gather`) is refused like another process.
- Advisory locks are only as good as the filesystem's `flock`: on some network filesystems
  they may not exclude a writer on another host.
"""

from __future__ import annotations

import contextvars
import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shell.errors import ConfigError

__all__ = ["LOCK_FILE", "LogDirLockedError", "hold_log_dir"]

LOCK_FILE = "rlpure.lock"
"""The lock file in a log directory; it holds the pid and host of the run holding the lock."""


class LogDirLockedError(ConfigError):
    """Another run holds the log directory's lock; the message names its pid.

    A `ConfigError` (the CLI's exit code 2): the fix is a choice of `--log-dir`.

    Attributes:
        holder: what the lock file says about the holder (`"pid 123 on host"`), or `""`.
    """

    def __init__(self, message: str, *, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


# Paths locked by this process (their lock file descriptors), and the paths the current
# context holds (what makes `hold_log_dir` re-entrant for its own holder only).
_LOCKED: dict[Path, int] = {}
_HELD_HERE: contextvars.ContextVar[frozenset[Path]] = contextvars.ContextVar(
    "rlpure_held_log_dirs", default=frozenset()
)


def _holder(fd: int) -> str:
    """What the lock file open at `fd` says about its holder (`""` if nothing yet)."""
    try:
        text = os.pread(fd, 256, 0).decode("utf-8", errors="replace").strip()
    except OSError:
        return ""
    pid, _, host = text.partition(" ")
    if not pid.isdigit():
        return ""
    return f"pid {pid}" + (f" on {host}" if host else "")


def _refusal(log_dir: Path, holder: str) -> LogDirLockedError:
    who = holder or "a process that has not written its pid yet"
    return LogDirLockedError(
        f"{log_dir}: another run is writing to this log dir ({who}). Wait for it to end, "
        "stop it, or use another --log-dir.",
        holder=holder,
    )


@contextmanager
def hold_log_dir(log_dir: str | os.PathLike[str]) -> Iterator[Path]:
    """Holds `log_dir`'s lock for the `with` block (creating the directory if needed).

    Yields:
        The resolved log directory.

    Raises:
        LogDirLockedError: another process, or another holder in this process, holds it.
        OSError: the directory or its lock file cannot be created or opened.
    """
    directory = Path(log_dir)
    directory.mkdir(parents=True, exist_ok=True)
    key = directory.resolve()
    if key in _HELD_HERE.get():
        yield key
        return
    if key in _LOCKED:
        raise _refusal(directory, _holder(_LOCKED[key]))
    fd = os.open(key / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise _refusal(directory, holder) from None
    except BaseException:
        os.close(fd)
        raise
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        _LOCKED[key] = fd
        token = _HELD_HERE.set(_HELD_HERE.get() | {key})
        try:
            yield key
        finally:
            _HELD_HERE.reset(token)
    finally:
        _LOCKED.pop(key, None)
        os.close(fd)  # closing the last descriptor releases the flock
