"""JAX's persistent compilation cache for the local backend, on by default.

Why: XLA compiles are most of the wait before a local run's first step — SmolLM2's LoRA
adapters' initialisation alone compiles for ~6 s, its first `forward_backward` for ~20 s, every
prompt-length bucket of its sampler for seconds more — and a new process (the next run, a
resumed run, a subprocess test) compiled them all again. With the cache on, a program compiled
once is read back from disk by every later process with the same JAX version, device and
program; the computed numbers are those of the same compiled program, so nothing changes but
the wait.

Conventions:
- `enable_compilation_cache()` runs when a `LocalServiceClient` is made. It changes nothing
  when the process has already chosen a cache directory (`jax.config` or the
  `JAX_COMPILATION_CACHE_DIR` environment variable) or when `RLPURE_COMPILATION_CACHE` is
  `off` (also `0`, `false`, `no`). Otherwise it sets the directory to `RLPURE_COMPILATION_CACHE`
  when that is a path, else `$XDG_CACHE_HOME/rlpure/jax` (`~/.cache/rlpure/jax`).
- Only compiles of at least `jax_persistent_cache_min_compile_time_secs` (JAX's default, 1 s)
  are written, so tiny programs add no files. The directory is capped at `MAX_CACHE_BYTES`
  (least recently used entries go first), which also makes JAX take a file lock around each
  read and write, so concurrent processes share one directory safely.
- A directory that cannot be created leaves the cache off with one logged warning; a damaged
  entry is recompiled (JAX warns and compiles).
- JAX's own warning applies: a compilation cache is trusted code; do not point it at a
  directory that other users can write.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

import jax

__all__ = ["CACHE_ENV", "MAX_CACHE_BYTES", "default_cache_dir", "enable_compilation_cache"]

CACHE_ENV = "RLPURE_COMPILATION_CACHE"
"""Environment variable: `off` disables the cache; a path puts it there."""

MAX_CACHE_BYTES = 2 << 30
"""The cache directory's size cap (2 GiB), least recently used entries evicted first."""

_OFF = frozenset({"off", "0", "false", "no"})

logger = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/rlpure/jax`, or `~/.cache/rlpure/jax` without `XDG_CACHE_HOME`."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "rlpure" / "jax"


def enable_compilation_cache() -> Path | None:
    """Turns JAX's persistent compilation cache on for this process, unless the process chose
    one already or `RLPURE_COMPILATION_CACHE` says `off` (see the module docstring).

    Returns:
        The cache directory in use (the process's own choice included), or None when the cache
        is off.
    """
    chosen = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]
    if chosen:
        return Path(chosen)
    setting = os.environ.get(CACHE_ENV, "").strip()
    if setting.lower() in _OFF:
        return None
    directory = Path(setting).expanduser() if setting else default_cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        logger.warning(
            "compilation cache off: cannot create %s (%s); set %s to a writable directory "
            "or to off",
            directory,
            error.strerror or error,
            CACHE_ENV,
        )
        return None
    capped = jax.config.jax_compilation_cache_max_size != -1  # type: ignore[attr-defined]
    if not capped and importlib.util.find_spec("filelock"):
        jax.config.update("jax_compilation_cache_max_size", MAX_CACHE_BYTES)  # type: ignore[no-untyped-call]
    jax.config.update("jax_compilation_cache_dir", str(directory))  # type: ignore[no-untyped-call]
    return directory
