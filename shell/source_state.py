"""The code a run ran: each module's git repository, its commit and its uncommitted diff.

Conventions:
- The text is tinker-cookbook 0.6.1's `code.diff` (`utils/code_state.code_state`): one section
  per repository, `### repo: <root> @ <commit>`, a `modules:` line, then the repo-wide diff of
  the working tree and index against HEAD (`-- repo-wide (vs HEAD, staged+unstaged) --`) or
  `(no local changes)`; a module outside any repository gets a `### module: <name> (not in a
  git repository)` note with its path.
- `git` is run as a subprocess with a timeout; a machine without `git` treats every module as
  outside a repository.
"""

from __future__ import annotations

import importlib
import subprocess
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

__all__ = ["source_state"]

_GIT_TIMEOUT_S = 30.0
"""Seconds one git command may take (a huge working tree should not hang a run's start)."""


def _git(directory: Path, *args: str) -> subprocess.CompletedProcess[str] | None:
    """`git -C directory args...`, or None when git is missing or timed out."""
    try:
        return subprocess.run(
            ["git", "-C", str(directory), *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=_GIT_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None


def _module_dir(module: ModuleType) -> Path:
    paths = getattr(module, "__path__", None)
    if paths is not None:  # a package: its first directory
        return Path(next(iter(paths))).resolve()
    file = getattr(module, "__file__", None)
    if file is None:
        raise ValueError(f"source_state: module {module.__name__!r} has no __file__ nor __path__")
    return Path(file).resolve().parent


def _repo_root(directory: Path) -> Path | None:
    done = _git(directory, "rev-parse", "--show-toplevel")
    if done is None or done.returncode != 0:
        return None
    return Path(done.stdout.strip()).resolve()


def _repo_section(root: Path, names: Sequence[str]) -> str:
    head = _git(root, "rev-parse", "HEAD")
    commit = head.stdout.strip() if head is not None and head.returncode == 0 else "UNKNOWN"
    diff = _git(root, "diff", "--no-color", "HEAD")
    text = diff.stdout if diff is not None else ""
    header = f"### repo: {root} @ {commit}\nmodules: {', '.join(sorted(names))}\n"
    if text:
        return header + "-- repo-wide (vs HEAD, staged+unstaged) --\n" + text.rstrip() + "\n"
    return header + "(no local changes)\n"


def source_state(modules: Sequence[str | ModuleType]) -> str:
    """The state of the code of `modules` (import names or modules), in the cookbook's
    `code.diff` format (see the module docstring).

    Raises:
        ImportError: a name that does not import.
        ValueError: a module with neither `__file__` nor `__path__`.
    """
    repos: dict[Path, list[str]] = {}
    outside: list[tuple[str, Path]] = []
    for item in modules:
        module = item if isinstance(item, ModuleType) else importlib.import_module(item)
        directory = _module_dir(module)
        root = _repo_root(directory)
        if root is None:
            outside.append((module.__name__, directory))
        elif module.__name__ not in repos.setdefault(root, []):
            repos[root].append(module.__name__)
    sections = [_repo_section(root, repos[root]) for root in sorted(repos, key=str)]
    sections += [
        f"### module: {name} (not in a git repository)\nmodule_path: {directory}\n"
        for name, directory in outside
    ]
    return "\n".join(sections)
