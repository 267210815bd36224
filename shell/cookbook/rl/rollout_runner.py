"""The cookbook's `tinker_cookbook.rl.rollout_runner`: the single-episode loop with limits.

A thin facade over `shell.rollouts` (`run_rollout(policy, env, *, limits, hooks, parse_errors,
config)`, its hooks and state, and the env seams); `shell.rollouts._episode` states the semantics.
"""

from __future__ import annotations

from shell.rollouts import (
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
    "TRUNCATION_METRIC_KEY",
    "RolloutHooks",
    "RolloutState",
    "SamplingTurnTimeoutError",
    "SupportsParseErrorPolicy",
    "SupportsToolCallLimit",
    "run_rollout",
    "stop_reason_from_metrics",
]
