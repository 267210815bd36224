"""Properties of the pure rollout-limit arithmetic (`rlpure.limits`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlpure import limits
from rlpure.records import StopReason

LIMIT = st.none() | st.integers(1, 200)
COUNT = st.integers(0, 250)


@given(ob=COUNT, sampled=COUNT, turn=LIMIT, trajectory=LIMIT, sampled_limit=LIMIT)
def test_per_turn_budget_is_the_least_applicable_term(ob, sampled, turn, trajectory, sampled_limit):
    budget = limits.per_turn_token_budget(
        observation_tokens=ob,
        sampled_tokens=sampled,
        max_turn_tokens=turn,
        max_trajectory_tokens=trajectory,
        max_sampled_tokens=sampled_limit,
    )
    terms = [turn] if turn is not None else []
    if trajectory is not None and trajectory - ob > 1:
        terms.append(trajectory - ob)
    if sampled_limit is not None and sampled_limit - sampled > 1:
        terms.append(sampled_limit - sampled)
    assert budget == (min(terms) if terms else None)
    if budget is not None:
        assert budget >= 1
        assert turn is None or budget <= turn


@given(ob=COUNT, sampled=COUNT, trajectory=LIMIT, sampled_limit=LIMIT)
def test_budget_stop_prefers_the_trajectory_budget(ob, sampled, trajectory, sampled_limit):
    reason = limits.budget_stop_reason(
        observation_tokens=ob,
        sampled_tokens=sampled,
        max_trajectory_tokens=trajectory,
        max_sampled_tokens=sampled_limit,
    )
    trajectory_out = trajectory is not None and trajectory - ob <= 1
    sampled_out = sampled_limit is not None and sampled_limit - sampled <= 1
    if trajectory_out:
        assert reason == StopReason.MAX_TOKENS
    elif sampled_out:
        assert reason == StopReason.MAX_SAMPLED_TOKENS
    else:
        assert reason is None


def test_a_remainder_of_one_is_exhausted_and_two_is_not():
    def stop(ob):
        return limits.budget_stop_reason(
            observation_tokens=ob, sampled_tokens=0, max_trajectory_tokens=10
        )

    assert stop(9) == "max_tokens"
    assert stop(8) is None
    assert (
        limits.per_turn_token_budget(
            observation_tokens=8, sampled_tokens=0, max_trajectory_tokens=10
        )
        == 2
    )
    # max_turn_tokens is a per-turn cap, not a budget: 1 is a valid one-token turn.
    assert (
        limits.per_turn_token_budget(observation_tokens=0, sampled_tokens=0, max_turn_tokens=1) == 1
    )


def test_stop_reason_from_metrics_takes_the_first_stop_key_whatever_its_value():
    assert limits.stop_reason_from_metrics({}) is None
    assert limits.stop_reason_from_metrics({"a": 1.0, "stop/x": 0.0, "stop/y": 1.0}) == "x"


REWARD = st.floats(-5, 5, allow_nan=False, width=32)
REASON = st.sampled_from([None, "completed", "max_turns", "max_tokens", "rollout_timeout"])


@st.composite
def _groups(draw):
    size = draw(st.integers(1, 6))
    steps = [draw(st.lists(REWARD, max_size=4)) for _ in range(size)]
    finals = [draw(REWARD) for _ in range(size)]
    reasons = [draw(REASON) for _ in range(size)]
    return steps, finals, reasons


@given(group=_groups(), limit_reasons=st.sets(st.sampled_from(["max_turns", "max_tokens", "x"])))
def test_clamp_caps_limit_stopped_totals_at_zero_and_keeps_the_rest(group, limit_reasons):
    steps, finals, reasons = group
    out = limits.zero_reward_on_limit(steps, finals, reasons, limit_stop_reasons=limit_reasons)
    for g, (s, final, reason) in enumerate(zip(steps, finals, reasons, strict=True)):
        total_before = sum(s) + final
        total_after = sum(s) + out.final_rewards_G[g]
        if reason in limit_reasons and total_before > 0.0:
            assert out.clamped_G[g]
            assert total_after == 0.0  # exactly: the group reward is -sum(steps)
        else:
            assert not out.clamped_G[g]
            assert out.final_rewards_G[g] == final
        assert total_after <= max(total_before, 0.0)


def test_clamp_refuses_ragged_inputs():
    with pytest.raises(ValueError, match="step_rewards_G has 1 items, final_rewards_G 2"):
        limits.zero_reward_on_limit([[0.0]], [1.0, 2.0], [None], limit_stop_reasons=())


@given(reasons=st.lists(REASON, max_size=4), skip=st.booleans(), zero=st.booleans())
def test_skip_grading_needs_every_member_timed_out_and_the_clamp(reasons, skip, zero):
    for limit_reasons in (["rollout_timeout"], ["max_turns"]):
        got = limits.skip_group_grading(
            reasons,
            skip_grading_on_timeout=skip,
            zero_reward_on_limit=zero,
            limit_stop_reasons=limit_reasons,
        )
        expected = (
            skip
            and zero
            and "rollout_timeout" in limit_reasons
            and bool(reasons)
            and all(r == "rollout_timeout" for r in reasons)
        )
        assert got == expected
