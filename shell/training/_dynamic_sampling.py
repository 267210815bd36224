"""DAPO's dynamic sampling in the sync step (`TrainConfig.dynamic_sampling`).

Yu et al. 2025 ("DAPO", §3.2) over-sample and drop the groups whose rewards are all equal
(they carry no gradient under group centring), sampling more until the batch is full. Here,
per step (`sample_until_mixed`):

1. round 1 rolls out every group of the step's batch, exactly as the plain sync step does (its
   seed, its strategy, `ctx.termination`);
2. while fewer than `groups_per_batch` groups have a non-constant total reward and fewer than
   `max_sampling_rounds` rounds ran, the groups that failed or have a constant reward roll out
   again (fresh envs from their builders) with the seed of the next round, and replace their
   earlier outcome; the non-constant ones are kept as they are;
3. the step trains on the first `groups_per_batch` non-constant groups in batch order
   (`groups_to_train`); all of them when the rounds ran out first; the first successful group
   when there is none, as `remove_constant_reward_groups` keeps one.

The step's `env/*` metrics and rollout pages read the last outcome of each builder; its token
counts read every group sampled in every round (discarded rounds included). Metrics:
`dynamic_sampling/rounds`, `dynamic_sampling/groups_sampled` (group rollouts over all rounds)
and `dynamic_sampling/groups_kept` (non-constant groups trained on). Rollout errors are counted
in every round. Sampling seeds: round `r` (from 0) of a step with seed `s` samples with
`(s + r * ROUND_SEED_STRIDE) mod 2**31`, so round 0 is the plain step's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from returns.result import Success

from rlpure.records import TrajectoryGroup
from shell.config import TrainConfig
from shell.env import EnvGroupBuilder, RLDataset
from shell.errors import ConfigError
from shell.rollouts import GroupOutcome, do_batch_rollouts
from shell.training._run import RunContext, RunState
from shell.training._steps import sampling_policy

__all__ = [
    "ROUND_SEED_STRIDE",
    "DynamicRollouts",
    "check_dynamic_sampling_dataset",
    "groups_to_train",
    "sample_until_mixed",
]

ROUND_SEED_STRIDE = 0x9E3779B1
"""Added to a step's sampling seed per extra round (mod 2**31)."""


class DynamicRollouts(NamedTuple):
    """What `sample_until_mixed` rolled out.

    Attributes:
        outcomes_P: the last outcome of each builder of the batch, in batch order.
        sampled: every successful group of every round (for the step's token counts).
        rounds: how many rounds ran.
        groups_sampled: group rollouts over all rounds.
    """

    outcomes_P: list[GroupOutcome]
    sampled: list[TrajectoryGroup]
    rounds: int
    groups_sampled: int


def check_dynamic_sampling_dataset(config: TrainConfig, dataset: RLDataset) -> None:
    """Refuses dynamic sampling that asks a step for more groups than its batch holds.

    Raises:
        ConfigError: `dynamic_sampling.groups_per_batch` exceeds the size of the dataset's
            first batch (or the dataset is empty).
    """
    dynamic = config.dynamic_sampling
    if dynamic is None:
        return
    size = len(dataset.get_batch(0)) if len(dataset) else 0
    if dynamic.groups_per_batch > size:
        raise ConfigError(
            f"TrainConfig.dynamic_sampling.groups_per_batch: {dynamic.groups_per_batch} is "
            f"larger than the dataset's batches ({size} groups); a step resamples its own "
            "batch, so set groups_per_batch <= the batch size"
        )


def _mixed(outcome: GroupOutcome | None) -> bool:
    if not isinstance(outcome, Success):
        return False
    totals = outcome.unwrap().get_total_rewards()
    return any(total != totals[0] for total in totals)


async def sample_until_mixed(
    ctx: RunContext, state: RunState, builders_P: Sequence[EnvGroupBuilder], *, seed: int
) -> DynamicRollouts:
    """The rounds of one step (see the module docstring, 1.-2.).

    Raises:
        ValueError: `ctx.config.dynamic_sampling` is None.
        Exception: a group error the strategy does not skip (as `do_batch_rollouts`).
    """
    config = ctx.config
    dynamic = config.dynamic_sampling
    if dynamic is None:
        raise ValueError("sample_until_mixed: config.dynamic_sampling is None")
    outcomes: list[GroupOutcome | None] = [None] * len(builders_P)
    sampled: list[TrajectoryGroup] = []
    rounds = groups_sampled = 0
    while rounds < dynamic.max_sampling_rounds:
        pending = [p for p, outcome in enumerate(outcomes) if not _mixed(outcome)]
        if not pending:
            break
        policy = sampling_policy(
            config, state.sampling_client, seed=(seed + rounds * ROUND_SEED_STRIDE) % 2**31
        )
        found = await do_batch_rollouts(
            [builders_P[p] for p in pending],
            policy,
            strategy=ctx.strategy,
            termination=ctx.termination,
            max_concurrent_groups=config.max_concurrent_groups,
        )
        rounds += 1
        groups_sampled += len(pending)
        for p, outcome in zip(pending, found, strict=True):
            outcomes[p] = outcome
            if ctx.error_counter is not None:
                ctx.error_counter.ingest(outcome)
            if isinstance(outcome, Success):
                sampled.append(outcome.unwrap())
        if sum(_mixed(outcome) for outcome in outcomes) >= dynamic.groups_per_batch:
            break
    done = [outcome for outcome in outcomes if outcome is not None]
    return DynamicRollouts(
        outcomes_P=done, sampled=sampled, rounds=rounds, groups_sampled=groups_sampled
    )


def groups_to_train(
    groups_P: Sequence[TrajectoryGroup], *, groups_per_batch: int
) -> list[TrajectoryGroup]:
    """The first `groups_per_batch` groups with a non-constant total reward, in order; the
    first group when none has one (see the module docstring, 3.)."""
    mixed = [g for g in groups_P if _mixed(Success(g))]
    if mixed:
        return mixed[:groups_per_batch]
    return list(groups_P[:1])
