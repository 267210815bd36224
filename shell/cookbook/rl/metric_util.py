"""The cookbook's `tinker_cookbook.rl.metric_util`: rollout metrics of a batch of groups.

A thin facade: `compute_trajectory_metrics(trajectory_groups_P, taglist_P)` is
`rlpure.metrics.trajectory_metrics`, which names its metrics as the cookbook does
(`env/all/reward/total`, `env/<tag>/...`, `by_group/frac_mixed`, ...); `RLTestSetEvaluator`
is `shell.evaluation.RLTestSetEvaluator` (rollouts over a test dataset at temperature 1.0, as the
cookbook's).
"""

from __future__ import annotations

from rlpure.metrics import trajectory_metrics as compute_trajectory_metrics
from shell.evaluation import RLTestSetEvaluator

__all__ = ["RLTestSetEvaluator", "compute_trajectory_metrics"]
