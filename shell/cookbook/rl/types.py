"""The cookbook's `tinker_cookbook.rl.types` under its own name: the env protocol and records.

A thin facade: every name is the project's own object, re-exported so cookbook env code ports
by rewriting `tinker_cookbook` to `shell.cookbook` in its imports. The protocol classes (`Env`,
`EnvGroupBuilder`, `RLDataset`, `RLDatasetBuilder`) come from `shell.env`; the records
(`StepResult`, `Transition`, `Trajectory`, `TrajectoryGroup`, `RolloutError`) and the metric
aliases from `rlpure.records`; `TokensWithLogprobs`, which the cookbook's module imports from
`completers`, is `shell.completion.TokensWithLogprobs`.

Differences a porter meets (each on purpose):
- Records convert what cookbook code hands them at construction (`tinker.ModelInput` or a
  list of ints for an observation, a bool metric); the frozen numpy form is what they hold.
- The records are frozen `msgspec.Struct`s with tuple fields and read-only numpy token arrays,
  not mutable dataclasses with lists: code that appends to `trajectory.transitions` or mutates
  a `StepResult` after building it must build a new record instead.
- `RLDatasetBuilder` is a plain abstract class; a cookbook builder that subclasses it under
  `@chz.chz` (as every cookbook recipe does) works unchanged.
"""

from __future__ import annotations

from rlpure.records import (
    PARSE_ERROR_MASKED_METRIC_KEY,
    STOP_METRIC_PREFIX,
    InitialObservationOverflow,
    Logs,
    Metrics,
    RolloutError,
    StepResult,
    StopCondition,
    StopReason,
    Trajectory,
    TrajectoryGroup,
    Transition,
)
from shell.completion import TokensWithLogprobs
from shell.env import (
    Action,
    ActionExtra,
    Env,
    EnvGroupBuilder,
    Logprobs,
    Observation,
    RLDataset,
    RLDatasetBuilder,
)

__all__ = [
    "PARSE_ERROR_MASKED_METRIC_KEY",
    "STOP_METRIC_PREFIX",
    "Action",
    "ActionExtra",
    "Env",
    "EnvGroupBuilder",
    "InitialObservationOverflow",
    "Logprobs",
    "Logs",
    "Metrics",
    "Observation",
    "RLDataset",
    "RLDatasetBuilder",
    "RolloutError",
    "StepResult",
    "StopCondition",
    "StopReason",
    "TokensWithLogprobs",
    "Trajectory",
    "TrajectoryGroup",
    "Transition",
]
