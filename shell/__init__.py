"""shell: the effect layer around `rlpure`.

Modules:
- `shell.env`: environments and datasets; `shell.datasets`: epoch-cycled and interleaved
  datasets; `shell.completers`: the sampler-facing token and message completers.
- `shell.datums`: padded batches to `tinker.Datum`s; `shell.cookbook`: records to
  tinker-cookbook's, for parity checks.
- `shell.config`: `TrainConfig`; `shell.errors`: the project's exceptions.
- `shell.clients`: the client boundary — the `ServiceClient` / `TrainingClient` /
  `SamplingClient` protocols every backend satisfies, and `make_service_client`.
- `shell.commands` and `shell.cli`: the `rlpure` command line and its command records.

Subpackages:
- `shell.rollouts`: async group rollouts under failure strategies; `shell.limits`: the
  single-episode loop with rollout limits, parse-error and termination policies.
- `shell.training`: the GRPO loop, the policy update, checkpoints, resuming and run logs;
  `shell.eval`: evaluators (the test-set one, custom ones, `BenchmarkResult`).
- `shell.local`: the local JAX backend that speaks the Tinker client interface.
- `shell.fakes`: scripted envs, policies and a Tinker SDK stand-in, for tests.
- `shell.recipes`: the recipes and commands the CLI offers (`toy`, `gsm8k`, `demo`).

tinker-cookbook's module names, thin facades so cookbook code ports by rewriting its import
prefix `tinker_cookbook.` to `shell.`: `shell.rl` (`types`, `problem_env`, `rollouts`,
`train`, ...), `shell.renderers`, `shell.completers`, `shell.tokenizer_utils`,
`shell.model_info`, `shell.exceptions`, `shell.utils`, `shell.preference`, `shell.cli_utils`,
`shell.tool_use` (tools and the agent env), `shell.sandbox` (code-executing tools).

This facade re-exports the names most code needs: envs, rollouts, completers, datums, config,
errors, the local clients and the training loop.
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
    RlpureError,
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
    "RetryOnFailure",
    "RlpureError",
    "RolloutStrategy",
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
