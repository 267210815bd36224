"""The cookbook's `tinker_cookbook.rl.rollout_limits`: rollout budgets and reward policies.

A thin facade over `shell.rollouts` (`RolloutLimits`, `ParseErrorPolicy`,
`TerminationRewardPolicy` with the cookbook's fields, defaults and validation);
`shell.rollouts._policies` states the semantics.
"""

from __future__ import annotations

from shell.rollouts import (
    DEFAULT_LIMIT_STOP_REASONS,
    DEFAULT_RETRY_MESSAGE_TEMPLATE,
    ParseErrorPolicy,
    RolloutLimits,
    TerminationRewardPolicy,
)

__all__ = [
    "DEFAULT_LIMIT_STOP_REASONS",
    "DEFAULT_RETRY_MESSAGE_TEMPLATE",
    "ParseErrorPolicy",
    "RolloutLimits",
    "TerminationRewardPolicy",
]
