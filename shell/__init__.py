"""shell: the effect layer around `rlpure`.

Environments and datasets (`shell.env`), async rollouts with failure strategies
(`shell.rollouts`), the sampler-facing completer (`shell.completers`), conversion of padded
batches to `tinker.Datum`s (`shell.datums`), records to tinker-cookbook's for parity checks
(`shell.cookbook`), the GRPO training loop (`shell.train`),
checkpoints, logs, config and the `rlpure` CLI, scripted fakes for tests (`shell.fakes`), and
the local JAX backend that speaks the Tinker client interface (`shell.local_backend`).
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
from shell.gsm8k import Gsm8kDataset, Gsm8kDatasetBuilder, Gsm8kEnv, load_gsm8k
from shell.local_backend import LocalSamplingClient, LocalServiceClient, LocalTrainingClient
from shell.rollouts import (
    FailFast,
    MinViableGroup,
    RetryOnFailure,
    RolloutStrategy,
    do_batch_rollouts,
    do_group_rollout,
    do_single_rollout,
)
from shell.train import TrainResult, evaluate, train_step

# `shell.train.train` (the loop) is not re-exported: `shell.train` must stay the module.

__all__ = [
    "BelowMinViableGroupError",
    "CheckpointError",
    "ConfigError",
    "Env",
    "EnvFailure",
    "EnvGroupBuilder",
    "FailFast",
    "GroupRolloutError",
    "Gsm8kDataset",
    "Gsm8kDatasetBuilder",
    "Gsm8kEnv",
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
    "load_gsm8k",
    "to_cookbook_groups",
    "to_tinker_datums",
    "to_tinker_model_input",
    "train_step",
]
