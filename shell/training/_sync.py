"""The synchronous, on-policy step: evaluation when due, rollouts of one batch, one update.

Step `i` (`run_sync_step`, the cookbook's `do_sync_training` step): `begin_step`
(`shell.training._steps`); `dataset.get_batch(i)` → all groups roll out concurrently
(`shell.rollouts.do_batch_rollouts`, applying `ctx.termination` after grading) with a
`TinkerTokenCompleter` over the current sampler, seeded with the step's seed; failed groups
are skipped and counted (`rollout_errors/*`, running totals of the call), and a step where
every group failed is skipped with a warning (`progress/skipped`: no training, same sampler);
else the successful groups' `env/*` metrics, `batch/num_groups`,
`batch/degenerate_groups_frac`, then `train_on_groups` (`update_policy`) and its metrics.
With `dynamic_sampling`, the rollouts are `sample_until_mixed`'s rounds (later rounds roll out
further batches of the dataset, new prompts), the step's metrics read every group of every
round and the update trains on `groups_to_train` (`shell.training._dynamic_sampling`, which
states its metrics).

Spans: `run_evals` (when evaluating), `sampling`, `do_train_step_and_get_sampling_client`
(and, inside `train_on_groups`, its parts).
"""

from __future__ import annotations

import logging

from rlpure import metrics as metrics_lib
from shell.env import RLDataset
from shell.rollouts import do_batch_rollouts
from shell.timing import span
from shell.training._dynamic_sampling import (
    DynamicRollouts,
    groups_to_train,
    sample_until_mixed,
)
from shell.training._run import RunContext, RunState, successful
from shell.training._steps import (
    StepResult,
    begin_step,
    record_rollouts,
    sampling_policy,
    update_metrics,
    update_policy,
)

__all__ = ["run_sync_step"]

logger = logging.getLogger(__name__)


async def run_sync_step(
    ctx: RunContext, state: RunState, step: int, *, dataset: RLDataset
) -> StepResult:
    """One synchronous step (see the module docstring): its metrics, its successful groups
    (empty: a skipped step) and the run's state after it."""
    config = ctx.config
    start = await begin_step(ctx, state, step)
    state, metrics = state._replace(key=start.key), start.metrics
    builders = list(dataset.get_batch(step))
    dynamic: DynamicRollouts | None = None
    with span("sampling"):
        if config.dynamic_sampling is not None:
            dynamic = await sample_until_mixed(
                ctx, state, builders, step=step, dataset=dataset, seed=start.seed
            )
            builders, outcomes = dynamic.builders_P, dynamic.outcomes_P
        else:
            outcomes = await do_batch_rollouts(
                builders,
                sampling_policy(config, state.sampling_client, seed=start.seed),
                strategy=ctx.strategy,
                termination=ctx.termination,
                max_concurrent_groups=config.max_concurrent_groups,
            )
    if ctx.error_counter is not None:
        if dynamic is None:  # dynamic sampling counts every round's outcomes itself
            for outcome in outcomes:
                ctx.error_counter.ingest(outcome)
        metrics.update(ctx.error_counter.get_metrics())
    kept_builders, groups = successful(builders, outcomes)
    if not groups:
        logger.warning(
            "Step %d: every group failed (%d groups); skipping the step", step, len(builders)
        )
        metrics["progress/skipped"] = 1
        return StepResult(metrics=metrics, groups=[], state=state)
    record_rollouts(ctx, step, groups, kept_builders)
    metrics.update(
        metrics_lib.trajectory_metrics(groups, [b.logging_tags() for b in kept_builders])
    )
    metrics["batch/num_groups"] = len(groups)
    # constant-reward groups carry no signal under group centring
    metrics["batch/degenerate_groups_frac"] = 1.0 - metrics["env/all/by_group/frac_mixed"]
    trained, sampled = groups, groups
    if dynamic is not None and config.dynamic_sampling is not None:
        trained = groups_to_train(groups, groups_per_batch=config.dynamic_sampling.groups_per_batch)
        sampled = dynamic.sampled
        metrics["dynamic_sampling/rounds"] = dynamic.rounds
        metrics["dynamic_sampling/groups_sampled"] = dynamic.groups_sampled
        metrics["dynamic_sampling/groups_kept"] = sum(
            len(set(g.get_total_rewards())) > 1 for g in trained
        )
    update = await update_policy(ctx, trained)
    found, totals = update_metrics(ctx, state.totals, sampled, update)
    metrics.update(found)
    state = state._replace(sampling_client=update.sampling_client, totals=totals)
    return StepResult(metrics=metrics, groups=groups, state=state)
