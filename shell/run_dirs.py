"""tinker-cookbook 0.6.1's `cli_utils`: default run paths and what to do with an existing log dir.

Same semantics and environment variable as the cookbook (`TINKER_COOKBOOK_RUNS_DIR`, default
`~/tinker-runs`), so a ported recipe writes where the cookbook's would.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from shell.errors import ConfigError
from shell.training._lock import hold_log_dir

__all__ = [
    "DEFAULT_RUNS_DIR",
    "RUNS_DIR_ENV_VAR",
    "LogdirBehavior",
    "check_log_dir",
    "model_name_from_argv",
    "runs_path",
]

logger = logging.getLogger(__name__)

LogdirBehavior = Literal["delete", "resume", "ask", "raise"]
"""What `check_log_dir` does with an existing directory."""

RUNS_DIR_ENV_VAR = "TINKER_COOKBOOK_RUNS_DIR"
"""The environment variable that moves the runs directory."""

DEFAULT_RUNS_DIR = "~/tinker-runs"
"""The runs directory when `RUNS_DIR_ENV_VAR` is unset or empty."""


def runs_path(*parts: str) -> str:
    """A path under the runs directory (`$TINKER_COOKBOOK_RUNS_DIR`, else `~/tinker-runs`).

    `runs_path("math_rl", run_name)` is `~/tinker-runs/math_rl/<run_name>` by default.
    """
    runs_dir = os.environ.get(RUNS_DIR_ENV_VAR) or DEFAULT_RUNS_DIR
    return str(Path(runs_dir).expanduser().joinpath(*parts))


def model_name_from_argv(argv: Sequence[str], default: str) -> str:
    """The last `model_name=...` override in `argv` (chz's precedence), else `default`."""
    model_name = default
    for arg in argv:
        if arg.startswith("model_name="):
            model_name = arg.removeprefix("model_name=")
    return model_name


def check_log_dir(log_dir: str, behavior_if_exists: LogdirBehavior) -> None:
    """Applies `behavior_if_exists` when `log_dir` exists; does nothing when it does not.

    Args:
        log_dir: the run's log directory.
        behavior_if_exists: `"delete"` removes it, `"resume"` keeps it (the loop resumes),
            `"raise"` raises, `"ask"` prompts on stdin for delete / resume / exit (exit ends
            the process with status 0).

    Raises:
        ConfigError: `"raise"` and the directory exists.
        LogDirLockedError: (a `ConfigError`) deleting a log dir a running run holds
            (`shell.training._lock`): its files are left as they are. The cookbook deletes it
            under the live run, which goes on writing into the new one's files.
        AssertionError: an unknown `behavior_if_exists` (the cookbook's error type).
    """
    if not Path(log_dir).exists():
        logger.info(
            "Log directory %s does not exist. Will create it and start logging there.", log_dir
        )
        return
    if behavior_if_exists == "delete":
        logger.info(
            "Log directory %s already exists. Will delete it and start logging there.", log_dir
        )
        _delete(log_dir)
    elif behavior_if_exists == "resume":
        return
    elif behavior_if_exists == "raise":
        raise ConfigError(f"Log directory {log_dir} already exists. Will not delete it.")
    elif behavior_if_exists == "ask":
        while True:
            answer = input(
                f"Log directory {log_dir} already exists. What do you want to do? "
                "[delete, resume, exit]: "
            )
            if answer == "delete":
                _delete(log_dir)
                return
            if answer == "resume":
                return
            if answer == "exit":
                raise SystemExit(0)
            logger.warning("Invalid input: %s. Please enter 'delete', 'resume', or 'exit'.", answer)
    else:
        raise AssertionError(f"Invalid behavior_if_exists: {behavior_if_exists}")


def _delete(log_dir: str) -> None:
    """Removes `log_dir` while holding its lock, so a run writing there is never wiped."""
    with hold_log_dir(log_dir):
        shutil.rmtree(log_dir)
