"""tinker-cookbook 0.6.1's module names over rlpure's own code.

Cookbook code ports by one rewrite of its imports, the package name `tinker_cookbook` to
`shell.cookbook` (`from tinker_cookbook.rl import types` → `from shell.cookbook.rl import
types`). Every module here is a facade or a signature adapter over the project's own rooms
(`shell.chat`, `shell.agents`, `shell.logtree`, `shell.training`, ...); nothing outside this
package imports it. Like `tinker_cookbook/__init__.py`, this one binds `__version__` and the
exception names.
"""

from shell.cookbook.exceptions import (
    AllTrajectoriesFailedError,
    BenchmarkNotFoundError,
    CheckpointError,
    ConfigurationError,
    DataError,
    DataFormatError,
    DataValidationError,
    EvalError,
    EvalGradingError,
    EvalTimeoutError,
    RendererError,
    SandboxError,
    TinkerCookbookError,
    TrainingError,
    WeightsAdapterError,
    WeightsDownloadError,
    WeightsError,
    WeightsMergeError,
)

__version__ = "0.6.1"
"""The tinker-cookbook release whose API this package mirrors."""

__all__ = [
    "AllTrajectoriesFailedError",
    "BenchmarkNotFoundError",
    "CheckpointError",
    "ConfigurationError",
    "DataError",
    "DataFormatError",
    "DataValidationError",
    "EvalError",
    "EvalGradingError",
    "EvalTimeoutError",
    "RendererError",
    "SandboxError",
    "TinkerCookbookError",
    "TrainingError",
    "WeightsAdapterError",
    "WeightsDownloadError",
    "WeightsError",
    "WeightsMergeError",
    "__version__",
]
