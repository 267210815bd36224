"""The cookbook's `tinker_cookbook.rl` package under its own module names.

A thin facade: each module re-exports the project's own objects under the names cookbook code
imports, so an env or recipe file ports by rewriting `tinker_cookbook.` to `shell.` in its
imports and nothing else. Nothing here is a second implementation:

- `shell.rl.types`: the env protocol (`shell.env`) and the records (`rlpure.records`).
- `shell.rl.problem_env`: `ProblemEnv`, `ProblemGroupBuilder` (`shell.env`).
- `shell.rl.rollout_strategy`, `shell.rl.rollouts`: strategies and rollouts
  (`shell.rollouts`).
- `shell.rl.data_processing`: advantages and datums with the cookbook's signatures
  (`rlpure.advantages`, `rlpure.packing`, `shell.datums`).
- `shell.rl.metric_util`: `compute_trajectory_metrics` (`rlpure.metrics`), `RLTestSetEvaluator`
  (`shell.eval`).
- `shell.rl.rollout_limits`, `shell.rl.rollout_runner`, `shell.rl.rollout_presets`: budgets,
  reward policies, the single-episode loop and per-model presets (`shell.limits`).
- `shell.rl.dataset_utils`, `shell.rl.interleaved`: epochs and blended datasets
  (`shell.datasets`).
- `shell.rl.message_env`: `MessageEnv`, `MessageStepResult`, `EnvFromMessageEnv` (message-level
  envs over a renderer).
- `shell.rl.train`: `Config`, `KLReferenceConfig` and `main`, mapped onto
  `shell.config.TrainConfig` and `shell.training.train`.

This package re-exports the names of the cookbook's `rl/__init__.py` that exist here.
"""

from shell.rl.dataset_utils import EpochCycledRLDataset, cycle_permutation, epoch_batch_index
from shell.rl.interleaved import InterleavedRLDatasetBuilder
from shell.rl.rollout_strategy import FailFast, RetryOnFailure, RolloutStrategy
from shell.rl.types import (
    Action,
    ActionExtra,
    Env,
    EnvGroupBuilder,
    Logs,
    Metrics,
    Observation,
    RLDataset,
    RLDatasetBuilder,
    RolloutError,
    StepResult,
    Trajectory,
    TrajectoryGroup,
    Transition,
)

__all__ = [
    "Action",
    "ActionExtra",
    "Env",
    "EnvGroupBuilder",
    "EpochCycledRLDataset",
    "FailFast",
    "InterleavedRLDatasetBuilder",
    "Logs",
    "Metrics",
    "Observation",
    "RLDataset",
    "RLDatasetBuilder",
    "RetryOnFailure",
    "RolloutError",
    "RolloutStrategy",
    "StepResult",
    "Trajectory",
    "TrajectoryGroup",
    "Transition",
    "cycle_permutation",
    "epoch_batch_index",
]
