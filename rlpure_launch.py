"""The `rlpure` console script: sets glibc's allocator for XLA's buffers, then runs `shell.cli`.

A module of its own, outside `shell`, so that the restart below comes before the project's
imports (importing any `shell` module runs `shell/__init__.py`, which loads JAX: ~2 s).

Each call of a jitted program on XLA's CPU backend allocates its scratch buffer anew (2.6 GB
for a SmolLM2 GRPO training call) and frees it after. glibc serves such a block with a fresh
`mmap` (or from a worker thread's own arena) and returns it to the kernel when freed, so every
call pays the kernel zeroing its pages on first touch: ~630,000 page faults, ~0.9 s a call
on a 2-core VM. With one arena (`MALLOC_ARENA_MAX=1`), no `mmap` for large blocks
(`MALLOC_MMAP_MAX_=0`) and no trimming (`MALLOC_TRIM_THRESHOLD_`), the freed block stays in
the process and the next call reuses its pages: `rlpure demo` ran in 63.1 and 61.4 s instead
of 73.3 and 70.4 s (same results, peak memory 4.4 GB instead of 4.7-4.8). The cost: the
process keeps its peak heap until it exits (a long-lived `rlpure serve` holds its largest
call's buffers between calls) and its threads share one arena.

glibc reads these variables only when a process starts, so `main` starts the command again
(`os.execve`, the same process id) with them set when any is missing; values already in the
environment win; `RLPURE_MALLOC=default` keeps glibc's defaults. Other C libraries (macOS,
musl) run the command as it is. The restart names the variables it added in
`RLPURE_MALLOC_ADDED`, so that programs the run starts for the user (a sandbox's commands)
get the environment the user started `rlpure` in (`user_environ`).
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping

__all__ = [
    "ADDED_VARIABLE",
    "ALLOCATOR_ENVIRON",
    "allocator_environ",
    "main",
    "start_with_allocator_environ",
    "user_environ",
]

ALLOCATOR_ENVIRON = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(1 << 40),
}

ADDED_VARIABLE = "RLPURE_MALLOC_ADDED"
"""Set by the restart: the `ALLOCATOR_ENVIRON` variables it added, comma-separated."""


def allocator_environ(environ: Mapping[str, str], libc: str) -> dict[str, str] | None:
    """The environment to start the command again with, or None when it runs as it is (a C
    library other than glibc, `RLPURE_MALLOC=default`, or every `ALLOCATOR_ENVIRON` variable
    already set).

    Examples:
        >>> started = allocator_environ({"MALLOC_ARENA_MAX": "4"}, "glibc")
        >>> started["MALLOC_ARENA_MAX"], started[ADDED_VARIABLE]
        ('4', 'MALLOC_MMAP_MAX_,MALLOC_TRIM_THRESHOLD_')
        >>> allocator_environ(ALLOCATOR_ENVIRON, "glibc") is None
        True
        >>> allocator_environ({}, "") is None
        True
    """
    if libc != "glibc" or environ.get("RLPURE_MALLOC") == "default":
        return None
    added = [name for name in ALLOCATOR_ENVIRON if name not in environ]
    if not added:
        return None
    return {**ALLOCATOR_ENVIRON, **environ, ADDED_VARIABLE: ",".join(added)}


def user_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without what the restart added (`ADDED_VARIABLE` and the variables it names):
    the environment the user started the command in, for the programs it runs for them.

    Examples:
        >>> user_environ({"PATH": "/bin", **allocator_environ({"PATH": "/bin"}, "glibc")})
        {'PATH': '/bin'}
        >>> user_environ({"MALLOC_ARENA_MAX": "4"})  # the user's own: kept
        {'MALLOC_ARENA_MAX': '4'}
    """
    added = set(environ.get(ADDED_VARIABLE, "").split(",")) & ALLOCATOR_ENVIRON.keys()
    return {k: v for k, v in environ.items() if k not in added and k != ADDED_VARIABLE}


def start_with_allocator_environ() -> None:
    """Starts this Python process again, the same command line under the same process id,
    when `allocator_environ` has variables to add; returns when it has none, when Python is
    embedded or reads its program from standard input (read once, it cannot be read again),
    and when the restart fails (one line on stderr; the command runs with glibc's defaults).
    Call it first: what was imported before it is imported again."""
    environ = allocator_environ(os.environ, platform.libc_ver()[0])
    if environ is None or not sys.executable or not sys.orig_argv or sys.argv[0] in ("", "-"):
        return
    try:
        os.execve(sys.executable, sys.orig_argv, environ)
    except OSError as error:
        print(f"rlpure: running with glibc's default allocator ({error})", file=sys.stderr)


def main() -> int:
    """Entry point of the `rlpure` console script (`shell.cli.main` once the allocator's
    variables are set)."""
    start_with_allocator_environ()
    from shell.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    raise SystemExit(main())
