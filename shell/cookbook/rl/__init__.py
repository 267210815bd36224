"""`tinker_cookbook.rl` under its own module names: facades and signature adapters.

- `types`, `problem_env`: the env protocol (`shell.env`) and the records (`rlpure.records`).
- `rollout_strategy`, `rollouts`: strategies and rollouts (`shell.rollouts`).
- `data_processing`: advantages and datums with the cookbook's signatures (`rlpure.advantages`,
  `rlpure.packing`, `shell.datums`).
- `metric_util`: `compute_trajectory_metrics` (`rlpure.metrics`), `RLTestSetEvaluator`
  (`shell.evaluation`).
- `rollout_limits`, `rollout_runner`, `rollout_presets`: budgets, reward policies, the
  single-episode loop and per-model presets (`shell.rollouts`).
- `dataset_utils`, `interleaved`: epochs and blended datasets (`shell.datasets`).
- `message_env`: message-level envs over a renderer (`shell.agents`).
- `train`: `Config`, `KLReferenceConfig` and `main`, mapped onto `shell.config.TrainConfig` and
  `shell.training.train`.

This package re-exports the names of the cookbook's `rl/__init__.py` that exist here.
"""

from shell.cookbook.rl.dataset_utils import (
    EpochCycledRLDataset,
    cycle_permutation,
    epoch_batch_index,
)
from shell.cookbook.rl.interleaved import InterleavedRLDatasetBuilder
from shell.cookbook.rl.rollout_strategy import FailFast, RetryOnFailure, RolloutStrategy
from shell.cookbook.rl.types import (
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
