"""The cookbook's `tinker_cookbook.rl.rollout_strategy`: how a group's failed rollouts are handled.

A thin facade over `shell.rollouts` (the `RolloutStrategy` base with `FailFast`,
`RetryOnFailure`, `MinViableGroup`, the `RolloutResult` a strategy returns, and
`rollout_strategy_from_config`, the mapping of `Config.rollout_error_tolerance`), whose
docstring states the semantics.
"""

from __future__ import annotations

from shell.rollouts import (
    FailFast,
    MinViableGroup,
    RetryOnFailure,
    RolloutResult,
    RolloutStrategy,
    rollout_strategy_from_config,
)

__all__ = [
    "FailFast",
    "MinViableGroup",
    "RetryOnFailure",
    "RolloutResult",
    "RolloutStrategy",
    "rollout_strategy_from_config",
]
