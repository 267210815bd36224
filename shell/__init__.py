"""shell: the effect layer around `rlpure`.

Modules:
- `shell.env`: environments and datasets; `shell.datasets`: epoch-cycled and interleaved
  datasets; `shell.completion`: the sampler-facing token and message completers.
- `shell.datums`: padded batches to `tinker.Datum`s; `shell.to_cookbook`: records to
  tinker-cookbook's, for parity checks.
- `shell.config`: `TrainConfig`; `shell.errors`: the project's one exception family.
- `shell.clients`: the client boundary — the `ServiceClient` / `TrainingClient` /
  `SamplingClient` protocols every backend satisfies, and `make_service_client`.
- `shell.tokenizers`: tokenizers by model name; `shell.model_meta`: model metadata
  (recommended renderers); `shell.run_dirs`: default run paths and existing log dirs.
- `shell.commands` and `shell.cli`: the `rlpure` command line and its command records.

Subpackages:
- `shell.rollouts`: the single-episode loop with rollout limits, parse-error and termination
  policies, and async group rollouts under failure strategies.
- `shell.training`: the GRPO loop, the policy update, checkpoints, resuming and run logs;
  `shell.evaluation`: evaluators (the test-set one, custom ones, `BenchmarkResult`).
- `shell.chat`: chat-message renderers over `rlpure.render`; `shell.agents`: message envs,
  tools and the tool-calling agent env; `shell.sandboxes`: code-execution sandboxes;
  `shell.comparisons`: preference models and comparison datasets; `shell.logtree`: the
  scope-structured HTML/JSON run logs.
- `shell.local`: the local JAX backend that speaks the Tinker client interface.
- `shell.fakes`: scripted envs, policies and a Tinker SDK stand-in (tests, `--backend fake`).
- `shell.jobs`: the jobs the CLI offers (`toy`, `gsm8k`, `smollm2`, `tools`, `demo`).
- `shell.cookbook`: tinker-cookbook 0.6.1's module names as facades over the rooms above, so
  cookbook code ports by rewriting `tinker_cookbook` to `shell.cookbook` in its imports.

This facade re-exports the names most code needs: envs, rollouts, completers, datums, config,
errors, the local clients and the training loop.
"""

from shell.completion import TinkerTokenCompleter, TokenCompleter
from shell.config import TrainConfig, build_config, load_config_file
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
from shell.to_cookbook import to_cookbook_groups
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
