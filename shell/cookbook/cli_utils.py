"""`tinker_cookbook.cli_utils`: re-exported from `shell.run_dirs`."""

from shell.cookbook.exceptions import ConfigurationError
from shell.errors import (
    ConfigError,
)
from shell.run_dirs import (
    DEFAULT_RUNS_DIR,
    RUNS_DIR_ENV_VAR,
    LogdirBehavior,
    check_log_dir,
    model_name_from_argv,
    runs_path,
)

__all__ = [
    "DEFAULT_RUNS_DIR",
    "RUNS_DIR_ENV_VAR",
    "ConfigError",
    "ConfigurationError",
    "LogdirBehavior",
    "check_log_dir",
    "model_name_from_argv",
    "runs_path",
]
