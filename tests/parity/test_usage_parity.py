"""`rlpure.usage` against the cookbook's `rl.train.rollout_usage` / `training_usage` on the same
groups and datums (tinker-cookbook 0.6.1)."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpure.advantages import compute_advantages
from rlpure.packing import assemble_batch
from rlpure.records import Trajectory, TrajectoryGroup
from rlpure.testing import batches
from rlpure.usage import TokenUsage, rollout_usage, training_usage
from shell.datums import to_tinker_datums
from shell.to_cookbook import to_cookbook_groups
from tests.parity.porting import require_cookbook


def _cookbook() -> tuple[Any, Any]:
    require_cookbook()
    from tinker_cookbook.rl import data_processing, train

    return train, data_processing


def _with_cache_hits(
    groups_P: tuple[TrajectoryGroup, ...], hits: list[int]
) -> list[TrajectoryGroup]:
    """The groups with `prompt_cache_hit_tokens` set per transition (cycling `hits`, capped at the
    observation's length)."""
    out, n = [], 0
    for group in groups_P:
        trajectories = []
        for trajectory in group.trajectories_G:
            transitions = []
            for t in trajectory.transitions:
                hit = min(hits[n % len(hits)], t.ob.length)
                n += 1
                ac = msgspec.structs.replace(t.ac, prompt_cache_hit_tokens=hit)
                transitions.append(msgspec.structs.replace(t, ac=ac))
            trajectories.append(msgspec.structs.replace(trajectory, transitions=transitions))
        out.append(msgspec.structs.replace(group, trajectories_G=trajectories))
    return out


def _cookbook_groups(groups_P: list[TrajectoryGroup]) -> list[Any]:
    """`to_cookbook_groups`, plus each action's `prompt_cache_hit_tokens` (which it does not
    carry over)."""
    converted = to_cookbook_groups(groups_P)
    for theirs, mine in zip(converted, groups_P, strict=True):
        for traj_t, traj_m in zip(theirs.trajectories_G, mine.trajectories_G, strict=True):
            traj_t.transitions[:] = [
                dataclasses.replace(
                    t,
                    ac=dataclasses.replace(
                        t.ac, prompt_cache_hit_tokens=m.ac.prompt_cache_hit_tokens
                    ),
                )
                for t, m in zip(traj_t.transitions, traj_m.transitions, strict=True)
            ]
    return converted


def _ours(usage: Any) -> TokenUsage:
    return TokenUsage(**dataclasses.asdict(usage))


@settings(max_examples=60, deadline=None)
@given(
    groups_P=batches(min_groups=0, max_groups=3, max_turns=3),
    hits=st.lists(st.integers(0, 12), min_size=1, max_size=5),
)
def test_rollout_usage_matches_the_cookbooks(groups_P, hits):
    train, _ = _cookbook()
    groups = _with_cache_hits(groups_P, hits)
    assert rollout_usage(groups) == _ours(train.rollout_usage(_cookbook_groups(groups)))


@settings(max_examples=60, deadline=None)
@given(groups_P=batches(min_groups=1, max_groups=3, max_turns=3))
def test_training_usage_matches_the_cookbooks_on_our_datums_and_on_its_own(groups_P):
    train, data_processing = _cookbook()
    advantages = compute_advantages(groups_P)
    datums = to_tinker_datums(assemble_batch(groups_P, advantages), include_mask=False)
    assert training_usage(groups_P) == _ours(train.training_usage(datums))
    theirs, _ = data_processing.assemble_training_data(
        to_cookbook_groups(groups_P),
        data_processing.compute_advantages(to_cookbook_groups(groups_P)),
    )
    assert training_usage(groups_P) == _ours(train.training_usage(theirs))


def test_a_multi_turn_trajectory_counts_as_the_cookbooks():
    train, _ = _cookbook()
    from rlpure.records import TokensWithLogprobs, Transition

    def turn(ob: list[int], ac: list[int], hits: int, done: bool) -> Transition:
        action = TokensWithLogprobs(
            tokens=ac, logprobs=[-0.1] * len(ac), prompt_cache_hit_tokens=hits
        )
        return Transition(ob=ob, ac=action, reward=0.0, episode_done=done)

    trajectory = Trajectory(
        transitions=[turn([1, 2, 3], [4, 5], 0, False), turn([1, 2, 3, 4, 5, 6], [7], 5, True)]
    )
    groups = [TrajectoryGroup(trajectories_G=[trajectory], final_rewards_G=[1.0], metrics_G=[{}])]
    assert rollout_usage(groups) == _ours(train.rollout_usage(_cookbook_groups(groups)))
    assert rollout_usage(groups) == TokenUsage(sampled=3, prefill_cached=5, prefill_uncached=4)


def test_the_cookbooks_main_reads_the_token_totals_of_an_rlpure_checkpoint(tmp_path):
    require_cookbook()
    from tinker_cookbook import checkpoint_utils
    from tinker_cookbook.utils.cost_estimation import TokenUsage as CookbookTokenUsage

    from shell.fakes import FakeServiceClient
    from shell.training import load_checkpoints
    from tests.shell.test_usage_run import _config, _dataset, _train

    _train(_config(tmp_path, save_every=2), FakeServiceClient(), _dataset(3))
    resume_info = checkpoint_utils.get_last_checkpoint(str(tmp_path))
    assert resume_info is not None
    # what the cookbook's rl.train.main does with the row it resumes from
    cumulative = CookbookTokenUsage(**resume_info.get("cumulative_tokens", {}))
    discarded = CookbookTokenUsage(**resume_info.get("discarded_tokens", {}))
    last = load_checkpoints(tmp_path)[-1]
    assert _ours(cumulative) == last.cumulative_tokens and cumulative.sampled > 0
    assert _ours(discarded) == last.discarded_tokens
