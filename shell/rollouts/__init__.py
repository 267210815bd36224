"""Rollouts: one episode, one group under a failure strategy, and a batch of groups.

The semantics are tinker-cookbook 0.6.1's (`rl/rollout_strategy.py`, `rl/rollouts.py`), with
the cookbook's names, call shapes and defaults, so cookbook code ports by an import rewrite.

Conventions:
- `do_single_rollout(policy, env)` is `shell.limits.run_rollout(policy, env)`, the unconfigured
  single-episode loop (actions reach `Env.step` as `list[int]`, every step becomes a
  `rlpure.records.Transition`).
- A `RolloutStrategy` owns the collection of a group's trajectories (`execute`, which calls
  `make_envs` itself, so retries get fresh envs) and says whether group-level errors skip the
  group (`catches_group_errors`):
  `FailFast` — the first exception fails the group, cancels its siblings and propagates;
  `RetryOnFailure(max_retries=3, per_rollout_timeout=0)` — **any** `Exception` of a rollout
  (or a per-rollout timeout, a `TimeoutError`) is retried in a fresh env while the group's
  budget lasts; once spent, the next failure cancels the rest and re-raises (all-or-nothing);
  `MinViableGroup(min_successful=None, max_retries=3, per_rollout_timeout=None)` — retries only
  while fewer than the floor (`⌈0.75·G⌉`) succeeded; keeps a partial group at or above it and
  raises `AllTrajectoriesFailedError` below it.
  `asyncio.CancelledError` always propagates; so do the strategy's `fatal` types (default
  `(ConfigError,)`, a deliberate difference: the cookbook retries even configuration errors;
  pass `fatal=()` for its behaviour).
- `do_group_rollout(env_group_builder, policy, strategy=None, termination=None)`: the strategy
  collects, `compute_group_rewards` scores (bounded by `termination.grader_timeout_seconds`,
  skipped when every trajectory timed out and would be clamped anyway), limit-stopped
  trajectories are clamped to `min(total reward, 0)` (`zero_reward_on_limit`), then `cleanup()`
  runs exactly once — shielded from cancellation, so a slow cleanup finishes even when the
  rollout is cancelled (the cancellation is re-raised after it).
- Group errors become data one level up: `do_group_rollout_and_filter_constant_reward` returns
  `None` for a skipped group (cookbook), `do_batch_rollouts` one `GroupOutcome` per group
  (`Success(TrajectoryGroup)`, or `Failure(GroupFailure)` for a skipped one). A group is skipped on
  `AllTrajectoriesFailedError` under every strategy, and on any other non-fatal `Exception`
  under a strategy with `catches_group_errors`; otherwise the error propagates.
- `set_rollout_executor(executor)` (and `get_rollout_executor`) sends each group to a
  `concurrent.futures.Executor` (`asyncio.run` in a worker), as the cookbook's; both
  `do_group_rollout_and_filter_constant_reward` and `do_batch_rollouts` honour it.
- Error counts: `RolloutErrorCounter` accumulates `rollout_errors/<ErrorType>`,
  `rollout_errors/total` and `rollout_errors/groups_skipped` across calls, as the cookbook's;
  a skipped group counts once in `groups_skipped` (its trajectory errors are not counted).

Deliberate differences from the cookbook (each strictly safer, none changes a kept/skipped
outcome): trajectories keep **slot order** (env `g` of `make_envs()` fills slot `g`, a retry
refills it; the cookbook keeps completion order, which varies run to run); `FailFast` cancels
the sibling rollouts of a failed one (the cookbook's `asyncio.gather` leaves them running after
`cleanup()` released their resources) and takes an optional `per_rollout_timeout`; a `cleanup()`
that raises while another error propagates is logged and noted on that error instead of
replacing it (the cookbook warns that it masks the rollout error); invalid options
(`max_retries < 0`, a `MinViableGroup` timeout <= 0 that would time out every rollout, a floor
< 1, a group of zero envs) raise `ValueError` at once.
"""

from shell.rollouts._batch import (
    GroupFailure,
    GroupOutcome,
    RolloutErrorCounter,
    batch_rollout_error_metrics,
    do_batch_rollouts,
    do_group_rollout_outcome,
)
from shell.rollouts._group import (
    do_group_rollout,
    do_group_rollout_and_filter_constant_reward,
    get_rollout_executor,
    set_rollout_executor,
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
    "FailFast",
    "GroupFailure",
    "GroupOutcome",
    "MinViableGroup",
    "RetryOnFailure",
    "RolloutErrorCounter",
    "RolloutResult",
    "RolloutStrategy",
    "batch_rollout_error_metrics",
    "default_rollout_strategy_for_model",
    "do_batch_rollouts",
    "do_group_rollout",
    "do_group_rollout_and_filter_constant_reward",
    "do_group_rollout_outcome",
    "do_single_rollout",
    "get_rollout_executor",
    "min_viable_floor",
    "rollout_strategy_from_config",
    "set_rollout_executor",
]
