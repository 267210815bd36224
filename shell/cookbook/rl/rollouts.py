"""The cookbook's `tinker_cookbook.rl.rollouts`: one episode and one group of episodes.

A thin facade over `shell.rollouts`: `do_single_rollout(policy, env)` runs one env to
`episode_done`, `do_group_rollout(builder, policy, strategy=...)` a group under a rollout
strategy, `do_group_rollout_and_filter_constant_reward(...)` the same returning None for a
skipped or constant group, `RolloutErrorCounter` counts errors across steps, and
`set_rollout_executor` / `get_rollout_executor` send group rollouts to an executor (see
`shell.rollouts` for the conventions).
"""

from __future__ import annotations

from shell.rollouts import (
    RolloutErrorCounter,
    do_group_rollout,
    do_group_rollout_and_filter_constant_reward,
    do_single_rollout,
    get_rollout_executor,
    set_rollout_executor,
)

__all__ = [
    "RolloutErrorCounter",
    "do_group_rollout",
    "do_group_rollout_and_filter_constant_reward",
    "do_single_rollout",
    "get_rollout_executor",
    "set_rollout_executor",
]
