"""Test helpers for rlpure and its users: hypothesis strategies and slow references.

- This package exports the hypothesis strategies (`_strategies`) that build valid
  `rlpure.records` objects, for property tests of your own reward, advantage and datum code::

      from hypothesis import given
      from rlpure.testing import batches

      @given(batches(reward_kind="binary"))
      def test_my_advantages(groups_P): ...

- `rlpure.testing.reference`: slow, obviously-correct list-based references of the cookbook's
  algorithms (advantages, `trajectory_to_data`), for differential tests and benchmarks.

Importing it needs `hypothesis` (a test dependency); `import rlpure` never imports it.
"""

from __future__ import annotations

from rlpure.testing._strategies import (
    DEFAULT_MAX_GROUP_SIZE,
    DEFAULT_MAX_GROUPS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_MAX_TURNS,
    DEFAULT_VOCAB_SIZE,
    PrefixMode,
    RewardKind,
    batches,
    model_inputs,
    ragged_rewards,
    rewards,
    token_ids,
    tokens_with_logprobs,
    trajectories,
    trajectory_groups,
    transitions,
)

__all__ = [
    "DEFAULT_MAX_GROUPS",
    "DEFAULT_MAX_GROUP_SIZE",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MAX_TURNS",
    "DEFAULT_VOCAB_SIZE",
    "PrefixMode",
    "RewardKind",
    "batches",
    "model_inputs",
    "ragged_rewards",
    "rewards",
    "token_ids",
    "tokens_with_logprobs",
    "trajectories",
    "trajectory_groups",
    "transitions",
]
