"""The training loop and everything a run keeps in its log directory.

- `_loop`: `train` (the GRPO loop, resumable, as named stages: preflight → open the run →
  run the steps → finish), `evaluate`, `TrainResult`, `resolve_num_steps` (the run's length
  from `num_epochs` and `max_steps`).
- `_run`: what a run fixes (`RunContext`) and what its steps change (`RunState`, token totals).
- `_steps`: the step parts every mode shares (`begin_step`, evaluators, the update's metrics,
  `finish_step`: samples, metrics row, progress, checkpoint when due, spans).
- `_sync`, `_stream`, `_async`: the modes' steps (synchronous; streaming minibatches; async
  off-policy, with its own loops).
- `_policy_update`: one optimisation step on a step's groups (`train_on_groups`: advantages →
  datums → `forward_backward` + `optim_step` → metrics, returned as a `PolicyUpdate`) and its
  parts.
- `_checkpoints`: the `checkpoints.jsonl` row format (`CheckpointRecord`), read and written.
- `_saves`: the save policy (`Checkpointer`: periodic, rolling and final saves, their TTLs).
- `_restore`: the run's training client, restored from a checkpoint (`OpenedTrainingClient`).
- `_resume`: what a log dir records (`config.json`, `recipe_options.json`), which changes a
  resume refuses, and the checkpoint a run resumes from (`last_checkpoint`).
- `_lock`: one writer per log dir (`hold_log_dir`, `LogDirLockedError`, `LOCK_FILE`).
- `_logs`: `metrics.jsonl`, `samples.jsonl`, `logs.log`, the progress line and the reward
  curve.
- `_rollout_pages`: the per-iteration rollout reports (`iteration_NNNNNN/`, as the cookbook's).
- `_trackers`: the optional metric trackers (W&B, TensorBoard).
- phase spans of a step, their `time/*` metrics and `timing_spans.jsonl` are `shell.timing`
  (outside the package: the rollouts time their phases too).

Each part's docstring states its conventions. The clients these functions take are the
`shell.clients` protocols.
"""

from __future__ import annotations

from shell.training._checkpoints import CHECKPOINTS_FILE, CheckpointRecord, load_checkpoints
from shell.training._lock import LOCK_FILE, LogDirLockedError, hold_log_dir
from shell.training._logs import (
    LOGS_FILE,
    METRICS_FILE,
    REWARD_CURVE_FILE,
    SAMPLES_FILE,
    eval_metric_before_after,
    finite_json,
    headline_eval_metrics,
    read_jsonl,
)
from shell.training._loop import TrainResult, evaluate, resolve_num_steps, train
from shell.training._policy_update import (
    PolicyUpdate,
    TrainStepOutput,
    train_on_groups,
    train_step,
)
from shell.training._restore import OpenedTrainingClient, open_training_client
from shell.training._resume import (
    CONFIG_FILE,
    RECIPE_OPTIONS_FILE,
    RESUME_MAY_CHANGE,
    checked_last_checkpoint,
    last_checkpoint,
    recipe_options,
)

__all__ = [
    "CHECKPOINTS_FILE",
    "CONFIG_FILE",
    "LOCK_FILE",
    "LOGS_FILE",
    "METRICS_FILE",
    "RECIPE_OPTIONS_FILE",
    "RESUME_MAY_CHANGE",
    "REWARD_CURVE_FILE",
    "SAMPLES_FILE",
    "CheckpointRecord",
    "LogDirLockedError",
    "OpenedTrainingClient",
    "PolicyUpdate",
    "TrainResult",
    "TrainStepOutput",
    "checked_last_checkpoint",
    "eval_metric_before_after",
    "evaluate",
    "finite_json",
    "headline_eval_metrics",
    "hold_log_dir",
    "last_checkpoint",
    "load_checkpoints",
    "open_training_client",
    "read_jsonl",
    "recipe_options",
    "resolve_num_steps",
    "train",
    "train_on_groups",
    "train_step",
]
