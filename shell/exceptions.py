"""tinker-cookbook 0.6.1's exception names (`tinker_cookbook.exceptions`), on the shell's hierarchy.

Cookbook code catches and raises these names; the shell raises `shell.errors`. The two must
agree, and an `except` clause matches by real subclassing only (`__subclasscheck__` hooks are
ignored for exceptions), so the mapping is:

- **Same class** where the two hierarchies fit: `TinkerCookbookError` *is*
  `shell.errors.RlpureError`, `ConfigurationError` *is* `shell.errors.ConfigError`
  (`RlpureError` + `ValueError`, as the cookbook's), and `TrainingError`, `CheckpointError`
  and `AllTrajectoriesFailedError` *are* the `shell.errors` classes of those names (the
  shell's group-failure errors derive from `AllTrajectoriesFailedError`). Both directions are
  caught: our loop raising `ConfigError` is caught by a ported `except ConfigurationError`, and
  a ported env raising `ConfigurationError` is a `ConfigError` to our rollout strategies (a
  bug, not a rollout failure).
- **Subclass** where the cookbook's class has a shell counterpart with other semantics:
  `SandboxError(EnvFailure)`, so tolerant rollout strategies retry a sandbox failure, and it
  is still an `RlpureError` + `RuntimeError` as the cookbook's.
- **New classes** for the rest, each deriving from `RlpureError` and the stdlib exception the
  cookbook's derives from (`DataError` is a `ValueError`, `EvalTimeoutError` a `TimeoutError`,
  `BenchmarkNotFoundError` a `KeyError`, ...).

All are picklable (no custom `__init__` parameters beyond `GroupRolloutError`'s keyword
default).
"""

from __future__ import annotations

from shell import errors

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

TinkerCookbookError = errors.RlpureError
"""The cookbook's base exception: the same class as `shell.errors.RlpureError`."""

ConfigurationError = errors.ConfigError
"""A configuration value is invalid or missing: the same class as `shell.errors.ConfigError`
(a `ValueError`)."""


class DataError(errors.RlpureError, ValueError):
    """Training or evaluation data is unusable (base of the data errors)."""


class DataFormatError(DataError):
    """Data is structurally malformed (a JSONL line without `messages`, too few tokens)."""


class DataValidationError(DataError):
    """Data is well-formed but breaks a logical constraint (a stream cannot seek backward)."""


class RendererError(errors.RlpureError, ValueError):
    """A renderer is unknown, or messages cannot be rendered or a response parsed."""


TrainingError = errors.TrainingError
"""An error during a training loop: the same class as `shell.errors.TrainingError`."""

CheckpointError = errors.CheckpointError
"""A checkpoint cannot be saved, loaded or resumed: the same class as
`shell.errors.CheckpointError` (a `TrainingError`)."""

AllTrajectoriesFailedError = errors.AllTrajectoriesFailedError
"""Every trajectory of a rollout group failed; the loop skips the group. The same class as
`shell.errors.AllTrajectoriesFailedError` (a `GroupRolloutError`)."""


class WeightsError(errors.RlpureError):
    """Weights download, merge or export failed (grouping base, no stdlib parent)."""


class WeightsDownloadError(WeightsError, RuntimeError):
    """Weights could not be downloaded from Tinker storage."""


class WeightsMergeError(WeightsError, ValueError):
    """LoRA adapter weights are incompatible with the base model."""


class WeightsAdapterError(WeightsError, ValueError):
    """A LoRA adapter cannot be converted for serving."""


class SandboxError(errors.EnvFailure):
    """A code-execution sandbox failed; an `EnvFailure`, so tolerant strategies retry it."""


class EvalError(errors.RlpureError, RuntimeError):
    """A benchmark evaluation failed operationally (base of the eval errors)."""


class EvalTimeoutError(EvalError, TimeoutError):
    """One evaluation example exceeded its time limit."""


class EvalGradingError(EvalError):
    """The grader could not score a model response."""


class BenchmarkNotFoundError(EvalError, KeyError):
    """The requested benchmark is not in the registry."""
