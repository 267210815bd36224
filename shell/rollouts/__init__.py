"""Rollouts: one episode, one group under a failure strategy, a batch of groups.

tinker-cookbook 0.6.1's `rl/rollout_limits.py`, `rollout_presets.py`, `rollout_runner.py`,
`rollout_strategy.py` and `rollouts.py`, with their names, call shapes and defaults (the
`shell.cookbook.rl.*` facades map onto this package). Its parts, each importing only those
above it:

- `_policies`: the policy records `RolloutLimits`, `ParseErrorPolicy`,
  `TerminationRewardPolicy`, and `apply_zero_reward_on_limit` / `should_skip_group_grading`,
  which apply a termination policy to a graded group (the limit arithmetic is `rlpure.limits`).
- `_presets`: `RolloutConfig`, `simple()`, `agentic()`, `default_rollout_config_for_model`.
- `_episode`: `run_rollout(policy, env, *, limits, hooks, parse_errors, config)`, the
  single-episode loop that enforces the limits, with its hooks and env seams.
- `_strategies`: how a group's trajectories are collected — `FailFast`, `RetryOnFailure`,
  `MinViableGroup` (any non-fatal `Exception` of a rollout is retried in a fresh env; `fatal`
  defaults to `(ConfigError,)`, where the cookbook retries even those) — and
  `do_single_rollout`, the unconfigured `run_rollout`.
- `_group`: `do_group_rollout` (collect, grade, clamp limit-stopped trajectories, then a
  `cleanup()` shielded from cancellation) and the rollout executor.
- `_batch`: `do_batch_rollouts`, one `GroupOutcome` per group (a skipped group is
  `Failure(GroupFailure)`), and `RolloutErrorCounter`.

Deliberate differences from the cookbook, each strictly safer: trajectories keep slot order (env
`g` of `make_envs()` fills slot `g`, a retry refills it); `FailFast` cancels the siblings of a
failed rollout; a `cleanup()` error while another propagates is noted on it, not substituted;
invalid options raise `ValueError` at once.
"""

from shell.rollouts._batch import (
    GroupFailure,
    GroupOutcome,
    RolloutErrorCounter,
    batch_rollout_error_metrics,
    do_batch_rollouts,
    do_group_rollout_outcome,
)
from shell.rollouts._episode import (
    TRUNCATION_METRIC_KEY,
    RolloutHooks,
    RolloutState,
    SamplingTurnTimeoutError,
    SupportsParseErrorPolicy,
    SupportsToolCallLimit,
    run_rollout,
    stop_reason_from_metrics,
)
from shell.rollouts._group import (
    do_group_rollout,
    do_group_rollout_and_filter_constant_reward,
    get_rollout_executor,
    set_rollout_executor,
)
from shell.rollouts._policies import (
    DEFAULT_LIMIT_STOP_REASONS,
    DEFAULT_RETRY_MESSAGE_TEMPLATE,
    ZERO_REWARD_ON_LIMIT_METRIC_KEY,
    ParseErrorPolicy,
    RolloutLimits,
    TerminationRewardPolicy,
    apply_zero_reward_on_limit,
    should_skip_group_grading,
)
from shell.rollouts._presets import (
    RolloutConfig,
    ToolExecution,
    agentic,
    default_rollout_config_for_model,
    model_defaults_to_agentic,
    simple,
)
from shell.rollouts._strategies import (
    FailFast,
    MinViableGroup,
    RetryOnFailure,
    RolloutResult,
    RolloutStrategy,
    default_rollout_strategy_for_model,
    do_single_rollout,
    min_viable_floor,
    rollout_strategy_from_config,
)

__all__ = [
    "DEFAULT_LIMIT_STOP_REASONS",
    "DEFAULT_RETRY_MESSAGE_TEMPLATE",
    "TRUNCATION_METRIC_KEY",
    "ZERO_REWARD_ON_LIMIT_METRIC_KEY",
    "FailFast",
    "GroupFailure",
    "GroupOutcome",
    "MinViableGroup",
    "ParseErrorPolicy",
    "RetryOnFailure",
    "RolloutConfig",
    "RolloutErrorCounter",
    "RolloutHooks",
    "RolloutLimits",
    "RolloutResult",
    "RolloutState",
    "RolloutStrategy",
    "SamplingTurnTimeoutError",
    "SupportsParseErrorPolicy",
    "SupportsToolCallLimit",
    "TerminationRewardPolicy",
    "ToolExecution",
    "agentic",
    "apply_zero_reward_on_limit",
    "batch_rollout_error_metrics",
    "default_rollout_config_for_model",
    "default_rollout_strategy_for_model",
    "do_batch_rollouts",
    "do_group_rollout",
    "do_group_rollout_and_filter_constant_reward",
    "do_group_rollout_outcome",
    "do_single_rollout",
    "get_rollout_executor",
    "min_viable_floor",
    "model_defaults_to_agentic",
    "rollout_strategy_from_config",
    "run_rollout",
    "set_rollout_executor",
    "should_skip_group_grading",
    "simple",
    "stop_reason_from_metrics",
]
