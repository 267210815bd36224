"""The shell's exceptions: one project base, each subclass also the matching stdlib exception.

Conventions:
- Every exception the shell raises on purpose derives from `RlpureError`, so callers can catch
  "anything rlpure decided to raise" in one clause, and also from the stdlib exception a caller
  would naturally catch (`ValueError` for bad configuration, `TimeoutError` for deadlines,
  `RuntimeError` for failed effects), so existing `except ValueError:` code keeps working.
- Failures of the outside world (an env raising, a sampler timing out) are turned into data at
  the rollout edge (`rlpure.records.RolloutError`, `returns` containers); these classes are what
  is raised when such a failure has to cross a function boundary as an exception.
- Programming errors (`TypeError`, `AttributeError`, ...) and `asyncio.CancelledError` are never
  wrapped in these classes.
"""

from __future__ import annotations

from rlpure.records import RolloutError

__all__ = [
    "AllTrajectoriesFailedError",
    "BelowMinViableGroupError",
    "BenchmarkNotFoundError",
    "CheckpointError",
    "ConfigError",
    "ContextLengthError",
    "DataError",
    "DataFormatError",
    "DataValidationError",
    "EnvFailure",
    "EvalError",
    "EvalGradingError",
    "EvalTimeoutError",
    "GroupRolloutError",
    "RendererError",
    "RlpureError",
    "SandboxError",
    "TrainingError",
    "WeightsAdapterError",
    "WeightsDownloadError",
    "WeightsError",
    "WeightsMergeError",
]


class RlpureError(Exception):
    """Base class of every exception rlpure raises on purpose."""


class ConfigError(RlpureError, ValueError):
    """A configuration value (file, CLI flag or argument) is invalid; the message names it.

    Not a rollout failure: the tolerant rollout strategies list it in their `fatal` types, so
    it propagates instead of being retried or skipped (retrying would only repeat it).
    """


class TrainingError(RlpureError, RuntimeError):
    """An error while running a training loop (the cookbook's `TrainingError`)."""


class CheckpointError(TrainingError):
    """A checkpoint record or the checkpoint log in a log directory cannot be used to resume."""


class EnvFailure(RlpureError, RuntimeError):
    """An environment failed for an outside reason (sandbox crash, grader unavailable, ...).

    Tolerant rollout strategies retry any `Exception` (as the cookbook's do), so raising this
    class is not required for a retry; it names the failure clearly in `rollout_errors`.
    """


class GroupRolloutError(TrainingError):
    """A group of rollouts failed as a whole; `errors` holds every captured trajectory error.

    Attributes:
        errors: the failures captured while collecting the group, oldest first.
    """

    def __init__(self, message: str, *, errors: tuple[RolloutError, ...] = ()) -> None:
        super().__init__(message)
        self.errors = errors


class AllTrajectoriesFailedError(GroupRolloutError):
    """Too few trajectories of a group succeeded; the group is skipped, not the run crashed.

    The cookbook's name (`tinker_cookbook.exceptions.AllTrajectoriesFailedError`): a group
    that raises it is skipped under every strategy, `FailFast` included
    (`shell.rollouts.do_batch_rollouts`, `do_group_rollout_and_filter_constant_reward`).
    """


class BelowMinViableGroupError(AllTrajectoriesFailedError):
    """`MinViableGroup`: fewer rollouts than the floor succeeded after all retries."""


class DataError(RlpureError, ValueError):
    """Training or evaluation data is unusable (base of the data errors)."""


class DataFormatError(DataError):
    """Data is structurally malformed (a JSONL line without `messages`, too few tokens)."""


class DataValidationError(DataError):
    """Data is well-formed but breaks a logical constraint (a stream cannot seek backward)."""


class ContextLengthError(RlpureError, ValueError):
    """A prompt and the tokens asked for exceed the model's context length (a `ValueError`, as
    the SDK's callers catch)."""


class RendererError(RlpureError, ValueError):
    """A renderer is unknown, or messages cannot be rendered or a response parsed."""


class WeightsError(RlpureError):
    """Weights download, merge or export failed (grouping base, no stdlib parent)."""


class WeightsDownloadError(WeightsError, RuntimeError):
    """Weights could not be downloaded from Tinker storage."""


class WeightsMergeError(WeightsError, ValueError):
    """LoRA adapter weights are incompatible with the base model."""


class WeightsAdapterError(WeightsError, ValueError):
    """A LoRA adapter cannot be converted for serving."""


class SandboxError(EnvFailure):
    """A code-execution sandbox failed; an `EnvFailure`, so tolerant strategies retry it."""


class EvalError(RlpureError, RuntimeError):
    """A benchmark evaluation failed operationally (base of the eval errors)."""


class EvalTimeoutError(EvalError, TimeoutError):
    """One evaluation example exceeded its time limit."""


class EvalGradingError(EvalError):
    """The grader could not score a model response."""


class BenchmarkNotFoundError(EvalError, KeyError):
    """The requested benchmark is not in the registry."""
