"""shell: the effect layer around `rlpure`.

Environments and datasets (`shell.env`), async rollouts with failure strategies
(`shell.rollouts`), the sampler-facing completer (`shell.completers`), conversion of padded
batches to `tinker.Datum`s (`shell.datums`), records to tinker-cookbook's for parity checks
(`shell.cookbook`), the GRPO training loop (`shell.training`),
checkpoints, logs, config and the `rlpure` CLI, scripted fakes for tests (`shell.fakes`), and
the local JAX backend that speaks the Tinker client interface (`shell.local`).
"""

from shell.completers import TinkerTokenCompleter, TokenCompleter
from shell.config import TrainConfig, build_config, load_config_file
from shell.cookbook import to_cookbook_groups
from shell.datums import to_tinker_datums, to_tinker_model_input
from shell.env import (
    Env,
    EnvGroupBuilder,
    ProblemEnv,
    ProblemGroupBuilder,
    RLDataset,
    RLDatasetBuilder,
)
from shell.errors import (
    BelowMinViableGroupError,
    CheckpointError,
    ConfigError,
    EnvFailure,
    GroupRolloutError,
    RetryBudgetExhaustedError,
    RlpureError,
    RolloutTimeoutError,
)
from shell.local import LocalSamplingClient, LocalServiceClient, LocalTrainingClient
from shell.rollouts import (
    FailFast,
    MinViableGroup,
    RetryOnFailure,
    RolloutStrategy,
    do_batch_rollouts,
    do_group_rollout,
    do_single_rollout,
)
from shell.training import TrainResult, evaluate, train, train_step

# `shell.training.train` (the loop) is not re-exported: `shell.training` must stay the module.

__all__ = [
    "BelowMinViableGroupError",
    "CheckpointError",
    "ConfigError",
    "Env",
    "EnvFailure",
    "EnvGroupBuilder",
    "FailFast",
    "GroupRolloutError",
    "LocalSamplingClient",
    "LocalServiceClient",
    "LocalTrainingClient",
    "MinViableGroup",
    "ProblemEnv",
    "ProblemGroupBuilder",
    "RLDataset",
    "RLDatasetBuilder",
    "RetryBudgetExhaustedError",
    "RetryOnFailure",
    "RlpureError",
    "RolloutStrategy",
    "RolloutTimeoutError",
    "TinkerTokenCompleter",
    "TokenCompleter",
    "TrainConfig",
    "TrainResult",
    "build_config",
    "do_batch_rollouts",
    "do_group_rollout",
    "do_single_rollout",
    "evaluate",
    "load_config_file",
    "to_cookbook_groups",
    "to_tinker_datums",
    "to_tinker_model_input",
    "train",
    "train_step",
]
