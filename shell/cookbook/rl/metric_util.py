"""The cookbook's `tinker_cookbook.rl.metric_util`: rollout metrics of a batch of groups.

A thin facade: `compute_trajectory_metrics(trajectory_groups_P, taglist_P)` is
`rlpure.metrics.trajectory_metrics`, which names its metrics as the cookbook does
(`env/all/reward/total`, `env/<tag>/...`, `by_group/frac_mixed`, ...); `RLTestSetEvaluator`
is `shell.evaluation.RLTestSetEvaluator` (rollouts over a test dataset at temperature 1.0, as the
cookbook's), adapted so that `_collect_eval_metrics` writes the rollout summaries to the
cookbook's `TrainingRunStore` when both a `rollout_summary_export` and a `store` are given, as
the cookbook's does, and so that its metrics are the cookbook's keys (without rlpure's
`<name>/num_groups`); `dataset_to_env_group_builders` flattens a dataset's batches.
"""

from __future__ import annotations

import itertools
from typing import cast

from rlpure.metrics import trajectory_metrics
from rlpure.records import TrajectoryGroup
from shell.cookbook.rl.rollout_logging import (
    RolloutSummaryExportConfig,
    serialize_rollout_summaries,
)
from shell.cookbook.rl.types import EnvGroupBuilder, RLDataset
from shell.evaluation import RLTestSetEvaluator as _RLTestSetEvaluator
from shell.storage import TrainingRunStore

__all__ = ["RLTestSetEvaluator", "compute_trajectory_metrics", "dataset_to_env_group_builders"]


def compute_trajectory_metrics(
    trajectory_groups_P: list[TrajectoryGroup], taglist_P: list[list[str]]
) -> dict[str, float]:
    """`rlpure.metrics.trajectory_metrics` under the cookbook's name and parameter names."""
    return trajectory_metrics(trajectory_groups_P, taglist_P)


def dataset_to_env_group_builders(dataset: RLDataset) -> list[EnvGroupBuilder]:
    """Every builder of every batch of `dataset`, in order."""
    return list(itertools.chain(*[dataset.get_batch(i) for i in range(len(dataset))]))


class RLTestSetEvaluator(_RLTestSetEvaluator):
    """Rollouts over a whole test dataset (the cookbook's `RLTestSetEvaluator`)."""

    def _collect_eval_metrics(
        self,
        results: list[TrajectoryGroup | None],
        rollout_summary_export: object | None,
        *,
        store: object | None = None,
    ) -> dict[str, float]:
        """The metrics of one evaluation; writes the rollout summaries as the cookbook does.

        Args:
            results: one entry per builder, None for a failed group.
            rollout_summary_export: a `RolloutSummaryExportConfig`, or None.
            store: a `TrainingRunStore`, or None (summaries are written only with both).
        """
        if rollout_summary_export is not None and store is not None:
            export = cast(RolloutSummaryExportConfig, rollout_summary_export)
            groups_P = [group for group in results if group is not None]
            taglist_P = [
                builder.logging_tags()
                for builder, group in zip(self.env_group_builders_P, results, strict=True)
                if group is not None
            ]
            step = export.sampling_client_step
            records = serialize_rollout_summaries(
                split=export.split,
                iteration=export.iteration,
                trajectory_groups_P=groups_P,
                taglist_P=taglist_P,
                sampling_client_steps_P=None if step is None else [step] * len(groups_P),
            )
            cast(TrainingRunStore, store).write_rollouts(
                export.iteration, records, base_name=export.base_name
            )
        metrics = super()._collect_eval_metrics(results, rollout_summary_export, store=store)
        # rlpure's `num_groups` is not the cookbook's: its evaluator reports no such metric
        metrics.pop(f"{self.name}/num_groups", None)
        if self.last_result is not None:
            self.last_result.metrics.pop("num_groups", None)
        return metrics
