"""Rollout limits, parse-error and termination policies, presets, and the rollout loop.

tinker-cookbook 0.6.1's `rl/rollout_limits.py`, `rl/rollout_presets.py` and
`rl/rollout_runner.py` (the `shell.cookbook.rl.rollout_*` facades map onto this package):

- `RolloutLimits`, `ParseErrorPolicy`, `TerminationRewardPolicy` (chz records with the
  cookbook's fields, defaults and validation), `DEFAULT_LIMIT_STOP_REASONS`,
  `DEFAULT_RETRY_MESSAGE_TEMPLATE`; `apply_zero_reward_on_limit` and
  `should_skip_group_grading` apply a termination policy to a graded group.
- `RolloutConfig`, `simple()`, `agentic()`, `default_rollout_config_for_model`,
  `model_defaults_to_agentic` (the model test behind `shell.rollouts`'
  `default_rollout_strategy_for_model`).
- `run_rollout(policy, env, *, limits, hooks, parse_errors, config)`, the single-episode loop
  that enforces the limits, with `RolloutHooks`, `RolloutState`, `SamplingTurnTimeoutError`,
  `stop_reason_from_metrics` and the env seams `SupportsToolCallLimit`,
  `SupportsParseErrorPolicy`.

The limit arithmetic itself is pure and lives in `rlpure.limits`.
"""

from shell.limits._policies import (
    DEFAULT_LIMIT_STOP_REASONS,
    DEFAULT_RETRY_MESSAGE_TEMPLATE,
    ZERO_REWARD_ON_LIMIT_METRIC_KEY,
    ParseErrorPolicy,
    RolloutLimits,
    TerminationRewardPolicy,
    apply_zero_reward_on_limit,
    should_skip_group_grading,
)
from shell.limits._presets import (
    RolloutConfig,
    ToolExecution,
    agentic,
    default_rollout_config_for_model,
    model_defaults_to_agentic,
    simple,
)
from shell.limits._runner import (
    TRUNCATION_METRIC_KEY,
    RolloutHooks,
    RolloutState,
    SamplingTurnTimeoutError,
    SupportsParseErrorPolicy,
    SupportsToolCallLimit,
    run_rollout,
    stop_reason_from_metrics,
)

__all__ = [
    "DEFAULT_LIMIT_STOP_REASONS",
    "DEFAULT_RETRY_MESSAGE_TEMPLATE",
    "TRUNCATION_METRIC_KEY",
    "ZERO_REWARD_ON_LIMIT_METRIC_KEY",
    "ParseErrorPolicy",
    "RolloutConfig",
    "RolloutHooks",
    "RolloutLimits",
    "RolloutState",
    "SamplingTurnTimeoutError",
    "SupportsParseErrorPolicy",
    "SupportsToolCallLimit",
    "TerminationRewardPolicy",
    "ToolExecution",
    "agentic",
    "apply_zero_reward_on_limit",
    "default_rollout_config_for_model",
    "model_defaults_to_agentic",
    "run_rollout",
    "should_skip_group_grading",
    "simple",
    "stop_reason_from_metrics",
]
