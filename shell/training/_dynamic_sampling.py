"""DAPO's dynamic sampling in the sync step (`TrainConfig.dynamic_sampling`).

Yu et al. 2025 ("DAPO", §3.2) over-sample and drop the groups whose rewards are all equal
(they carry no gradient under group centring), sampling more prompts until the batch is full;
verl's DAPO recipe keeps drawing batches of **new prompts** from its dataloader until it has
`train_batch_size` mixed groups, at most `max_num_gen_batches` batches. Here, per step `s` of
a dataset of `n` batches (`sample_until_mixed`):

1. round 0 rolls out every group of the step's batch `s`, exactly as the plain sync step does
   (its seed, its strategy, `ctx.termination`);
2. while fewer than `groups_per_batch` of the groups sampled so far have a non-constant total
   reward and fewer than `max_sampling_rounds` rounds ran, round `k` rolls out every group of
   batch `(s + k) mod n` (new prompts; the step's own again only when `n = 1`), with the seed
   of round `k`. The batch a round draws depends on `s` and `k` only, so a resumed run samples
   exactly what the uninterrupted one did (round `k` of step `s` and round 0 of step `s + k`
   then share prompts, with different seeds);
3. the step trains on the first `groups_per_batch` non-constant groups in sampling order
   (rounds in order, each in batch order; `groups_to_train`); all of them when the rounds ran
   out first; the first successful group when there is none, as
   `remove_constant_reward_groups` keeps one.

The step's `env/*` metrics, `batch/num_groups` and rollout pages read every group sampled in
every round (`DynamicRollouts.builders_P` / `outcomes_P`), and so do its token counts. Metrics:
`dynamic_sampling/rounds`, `dynamic_sampling/groups_sampled` (group rollouts over all rounds)
and `dynamic_sampling/groups_kept` (non-constant groups trained on). Rollout errors are counted
in every round. Sampling seeds: round `k` (from 0) of a step with seed `s` samples with
`(s + k * ROUND_SEED_STRIDE) mod 2**31`, so round 0 is the plain step's.
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
    "round_batch_index",
    "sample_until_mixed",
]

ROUND_SEED_STRIDE = 0x9E3779B1
"""Added to a step's sampling seed per extra round (mod 2**31)."""


class DynamicRollouts(NamedTuple):
    """What `sample_until_mixed` rolled out.

    Attributes:
        builders_P: the builders of every round, in sampling order.
        outcomes_P: their outcomes, in the same order.
        sampled: every successful group of every round (for the step's token counts).
        rounds: how many rounds ran.
        groups_sampled: group rollouts over all rounds.
    """

    builders_P: list[EnvGroupBuilder]
    outcomes_P: list[GroupOutcome]
    sampled: list[TrajectoryGroup]
    rounds: int
    groups_sampled: int


def check_dynamic_sampling_dataset(config: TrainConfig, dataset: RLDataset) -> None:
    """Refuses dynamic sampling that asks a step for more groups than a batch holds.

    Reads `dataset.get_batch(0)` only (a dataset may hold many batches): a later, shorter
    batch is no error, the rounds then draw further batches until `groups_per_batch` groups
    are mixed (or the rounds run out).

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
            f"larger than the dataset's batches ({size} groups); a step trains at most one "
            "batch's worth of groups, so set groups_per_batch <= the batch size"
        )


def round_batch_index(step: int, round_index: int, num_batches: int) -> int:
    """The batch round `round_index` (from 0) of step `step` rolls out: `(step + round) mod
    num_batches` (see the module docstring, 2.).

    Examples:
        >>> [round_batch_index(3, k, 5) for k in range(4)]
        [3, 4, 0, 1]
    """
    return (step + round_index) % num_batches


def _mixed(outcome: GroupOutcome) -> bool:
    if not isinstance(outcome, Success):
        return False
    totals = outcome.unwrap().get_total_rewards()
    return any(total != totals[0] for total in totals)


async def sample_until_mixed(
    ctx: RunContext,
    state: RunState,
    builders_P: Sequence[EnvGroupBuilder],
    *,
    step: int,
    dataset: RLDataset,
    seed: int,
) -> DynamicRollouts:
    """The rounds of one step (see the module docstring, 1.-2.): `builders_P` (the step's
    batch, `dataset.get_batch(step)`) first, then the batches `round_batch_index` names.

    Raises:
        ValueError: `ctx.config.dynamic_sampling` is None.
        Exception: a group error the strategy does not skip (as `do_batch_rollouts`).
    """
    config = ctx.config
    dynamic = config.dynamic_sampling
    if dynamic is None:
        raise ValueError("sample_until_mixed: config.dynamic_sampling is None")
    builders: list[EnvGroupBuilder] = []
    outcomes: list[GroupOutcome] = []
    sampled: list[TrajectoryGroup] = []
    rounds = 0
    while rounds < dynamic.max_sampling_rounds:
        drawn = (
            list(builders_P)
            if rounds == 0
            else list(dataset.get_batch(round_batch_index(step, rounds, len(dataset))))
        )
        policy = sampling_policy(
            config, state.sampling_client, seed=(seed + rounds * ROUND_SEED_STRIDE) % 2**31
        )
        found = await do_batch_rollouts(
            drawn,
            policy,
            strategy=ctx.strategy,
            termination=ctx.termination,
            max_concurrent_groups=config.max_concurrent_groups,
        )
        rounds += 1
        builders.extend(drawn)
        outcomes.extend(found)
        for outcome in found:
            if ctx.error_counter is not None:
                ctx.error_counter.ingest(outcome)
            if isinstance(outcome, Success):
                sampled.append(outcome.unwrap())
        if sum(_mixed(outcome) for outcome in outcomes) >= dynamic.groups_per_batch:
            break
    return DynamicRollouts(
        builders_P=builders,
        outcomes_P=outcomes,
        sampled=sampled,
        rounds=rounds,
        groups_sampled=len(builders),
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
