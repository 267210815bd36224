"""The cookbook's `tinker_cookbook.rl.rollouts`: one episode and one group of episodes.

A thin facade over `shell.rollouts`: `do_single_rollout(policy, env)` runs one env to
`episode_done`, `do_group_rollout(builder, policy, strategy=...)` a group under a rollout
strategy (see `shell.rollouts` for the conventions).
"""

from __future__ import annotations

from shell.rollouts import do_group_rollout, do_single_rollout

__all__ = ["do_group_rollout", "do_single_rollout"]
