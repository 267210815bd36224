"""The cookbook's `tinker_cookbook.rl.rollout_strategy`: how a group's failed rollouts are handled.

A thin facade over `shell.rollouts` (`FailFast`, `RetryOnFailure`, `MinViableGroup`, and the
`RolloutStrategy` union of the three), whose docstring states the semantics.
"""

from __future__ import annotations

from shell.rollouts import FailFast, MinViableGroup, RetryOnFailure, RolloutStrategy

__all__ = ["FailFast", "MinViableGroup", "RetryOnFailure", "RolloutStrategy"]
