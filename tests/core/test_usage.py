"""`rlpure.usage`: the cookbook's token counts, checked against plain loops and the packer."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpure.advantages import compute_advantages
from rlpure.packing import assemble_batch
from rlpure.records import TokensWithLogprobs, Trajectory, TrajectoryGroup, Transition
from rlpure.testing import batches
from rlpure.usage import (
    TOKEN_KINDS,
    TokenUsage,
    rollout_usage,
    trained_tokens_of_batch,
    training_usage,
)

usages = st.builds(
    TokenUsage,
    sampled=st.integers(0, 10**9),
    prefill_cached=st.integers(0, 10**9),
    prefill_uncached=st.integers(0, 10**9),
    trained=st.integers(0, 10**9),
)


def _group(obs_acs_hits: list[list[tuple[list[int], list[int], int]]]) -> TrajectoryGroup:
    trajectories = [
        Trajectory(
            transitions=[
                Transition(
                    ob=ob,
                    ac=TokensWithLogprobs(
                        tokens=np.asarray(ac, np.int32),
                        logprobs=np.full(len(ac), -0.5, np.float32),
                        prompt_cache_hit_tokens=hits,
                    ),
                    reward=0.0,
                    episode_done=k == len(turns) - 1,
                )
                for k, (ob, ac, hits) in enumerate(turns)
            ]
        )
        for turns in obs_acs_hits
    ]
    return TrajectoryGroup(
        trajectories_G=trajectories,
        final_rewards_G=[float(g) for g in range(len(trajectories))],
        metrics_G=[{} for _ in trajectories],
    )


def test_multi_turn_prefill_counts_every_turns_whole_observation_and_trains_the_prefix_once():
    # turn 2 extends turn 1 (ob1 + ac1 + 1 new token): one datum of 3+2+1+2 = 8 tokens
    group = _group([[([1, 2, 3], [4, 5], 2), ([1, 2, 3, 4, 5, 6], [7, 8], 5)]])
    assert rollout_usage([group]) == TokenUsage(sampled=4, prefill_cached=7, prefill_uncached=2)
    assert training_usage([group]) == TokenUsage(trained=7)  # model_input = full minus last


def test_a_non_extending_turn_starts_a_new_datum():
    group = _group([[([1, 2, 3], [4, 5], 0), ([9, 9], [7], 0)]])
    assert training_usage([group]).trained == (5 - 1) + (3 - 1)


def test_over_reported_cache_hits_are_capped_at_the_observation():
    group = _group([[([1, 2], [3], 10)]])
    assert rollout_usage([group]) == TokenUsage(sampled=1, prefill_cached=2, prefill_uncached=0)


@settings(max_examples=40, deadline=None)
@given(groups_P=batches(min_groups=0, max_groups=3, max_turns=3))
def test_rollout_usage_is_the_plain_sum_over_transitions(groups_P):
    transitions = [
        t for group in groups_P for traj in group.trajectories_G for t in traj.transitions
    ]
    usage = rollout_usage(groups_P)
    assert usage.sampled == sum(len(t.ac.tokens) for t in transitions)
    assert usage.prefill_cached + usage.prefill_uncached == sum(t.ob.length for t in transitions)
    assert usage.trained == 0


@settings(max_examples=40, deadline=None)
@given(groups_P=batches(min_groups=1, max_groups=3, max_turns=3))
def test_training_usage_is_the_assembled_batchs_model_input_tokens(groups_P):
    batch = assemble_batch(groups_P, compute_advantages(groups_P))
    assert training_usage(groups_P) == TokenUsage(trained=trained_tokens_of_batch(batch))


@settings(max_examples=40, deadline=None)
@given(groups_P=batches(min_groups=0, max_groups=4, max_turns=2), data=st.data())
def test_usage_adds_over_any_split_of_the_groups(groups_P, data):
    cut = data.draw(st.integers(0, len(groups_P)))
    head, tail = list(groups_P[:cut]), list(groups_P[cut:])
    assert rollout_usage(groups_P) == rollout_usage(head) + rollout_usage(tail)
    if head and tail:
        assert training_usage(groups_P) == training_usage(head) + training_usage(tail)


@given(a=usages, b=usages, c=usages)
def test_addition_is_a_commutative_monoid_with_zero(a, b, c):
    assert a + b == b + a
    assert (a + b) + c == a + (b + c)
    assert a + TokenUsage() == a


@given(u=usages)
def test_mapping_round_trip_and_metric_names(u):
    assert TokenUsage.from_mapping(u.as_dict(), where="w") == u
    assert TokenUsage.from_mapping(msgspec.json.decode(msgspec.json.encode(u)), where="w") == u
    assert list(u.metrics("tokens/cumulative")) == [f"tokens/cumulative/{k}" for k in TOKEN_KINDS]


def test_from_mapping_reads_missing_and_refuses_bad_counts():
    assert TokenUsage.from_mapping(None, where="row") == TokenUsage()
    assert TokenUsage.from_mapping({"sampled": 2}, where="row") == TokenUsage(sampled=2)
    with pytest.raises(ValueError, match=r"row: unknown token kinds \['bogus'\]"):
        TokenUsage.from_mapping({"bogus": 1}, where="row")
    with pytest.raises(ValueError, match=r"row.trained: expected an int >= 0, got -1"):
        TokenUsage.from_mapping({"trained": -1}, where="row")
    with pytest.raises(ValueError, match=r"TokenUsage\.sampled: expected >= 0"):
        TokenUsage(sampled=-1)
