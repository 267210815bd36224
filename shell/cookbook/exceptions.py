"""`tinker_cookbook.exceptions`: the cookbook's exception names over `shell.errors`.

An `except` clause matches by real subclassing only, so every name here *is* a `shell.errors`
class: `TinkerCookbookError` is `RlpureError`, `ConfigurationError` is `ConfigError` (a
`ValueError`), and the rest carry the cookbook's own names in `shell.errors`.
"""

from shell.errors import (
    AllTrajectoriesFailedError,
    BenchmarkNotFoundError,
    CheckpointError,
    DataError,
    DataFormatError,
    DataValidationError,
    EvalError,
    EvalGradingError,
    EvalTimeoutError,
    RendererError,
    SandboxError,
    TrainingError,
    WeightsAdapterError,
    WeightsDownloadError,
    WeightsError,
    WeightsMergeError,
)
from shell.errors import ConfigError as ConfigurationError
from shell.errors import RlpureError as TinkerCookbookError

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
]
