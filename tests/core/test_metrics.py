"""Tests for rlpure.metrics: golden values from hand-built groups, a slow loop reference,
tag semantics, JSON-serialisability, and the token-level KL/entropy metrics."""

from __future__ import annotations

import doctest
import json
import math
import re

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlpure.metrics as metrics_module
from rlpure.metrics import (
    kl_sample_train_metrics,
    rollout_error_metrics,
    sampling_client_metrics,
    trajectory_metrics,
)
from rlpure.records import (
    ModelInput,
    RolloutError,
    TokensWithLogprobs,
    Trajectory,
    TrajectoryGroup,
    Transition,
)


def step(ob_len, ac_len, reward=0.0, metrics=None, done=False, cached=0):
    return Transition(
        ob=ModelInput.from_ints(list(range(ob_len))),
        ac=TokensWithLogprobs(
            tokens=np.arange(ac_len, dtype=np.int32), prompt_cache_hit_tokens=cached
        ),
        reward=reward,
        episode_done=done,
        metrics=metrics or {},
    )


def group(trajs, finals, metrics_G=None):
    return TrajectoryGroup(
        trajectories_G=tuple(Trajectory(transitions=tuple(t)) for t in trajs),
        final_rewards_G=tuple(finals),
        metrics_G=tuple(metrics_G or [{} for _ in trajs]),
    )


def golden_groups():
    # Group A (math): two single-turn trajectories, mixed rewards.
    a = group(
        [
            [step(4, 3, metrics={"format": 1, "correct": 1}, done=True)],
            [step(4, 5, metrics={"format": 0, "correct": 0}, done=True)],
        ],
        finals=[1.0, 0.0],
        metrics_G=[{"stop/length": 0}, {"stop/length": 1}],
    )
    # Group B (chat): one two-turn trajectory with step rewards 0.25 + 0.25, final 0.5 → 1.0
    # total, and one with an empty action: total reward 1.0 too → all good.
    b = group(
        [
            [step(2, 2, reward=0.25, metrics={"format": 1}), step(6, 1, reward=0.25, done=True)],
            [step(3, 0, reward=1.0, done=True)],
        ],
        finals=[0.5, 0.0],
    )
    # Group C (math): group of size 1, reward 0 → all bad.
    c = group([[step(5, 4, metrics={"correct": 0}, done=True)]], finals=[0.0])
    return [a, b, c], [["math"], ["chat"], ["math"]]


def test_golden_all():
    groups, _ = golden_groups()
    m = trajectory_metrics(groups)
    # transitions: A 2, B 3, C 1 → 6 turns over 5 episodes
    assert m["env/all/total_turns"] == 6.0
    assert m["env/all/total_episodes"] == 5.0
    assert m["env/all/turns_per_episode"] == pytest.approx(6 / 5)
    assert m["env/all/total_ac_tokens"] == 3 + 5 + 2 + 1 + 0 + 4
    assert m["env/all/total_ob_tokens"] == 4 + 4 + 2 + 6 + 3 + 5
    assert m["env/all/total_cached_ob_tokens"] == 0  # the golden turns report no cache hits
    assert m["env/all/ac_tokens_per_turn"] == pytest.approx(15 / 6)
    assert m["env/all/ob_tokens_per_turn"] == pytest.approx(24 / 6)
    # totals: 1, 0, 1, 1, 0 → mean 0.6
    assert m["env/all/reward/total"] == pytest.approx(0.6)
    # format on 3 transitions: 1, 0, 1 ; correct on 3: 1, 0, 0 ; stop/length on 2 groups' trajs
    assert m["env/all/format"] == pytest.approx(2 / 3)
    assert m["env/all/correct"] == pytest.approx(1 / 3)
    assert m["env/all/stop/length"] == pytest.approx(0.5)
    assert m["env/all/by_group/frac_mixed"] == pytest.approx(1 / 3)
    assert m["env/all/by_group/frac_all_good"] == pytest.approx(1 / 3)
    assert m["env/all/by_group/frac_all_bad"] == pytest.approx(1 / 3)
    assert not any(k.startswith("env/math") for k in m)
    assert all(type(v) is float for v in m.values())
    json.dumps(m)


def test_cached_prompt_tokens_are_the_sampler_reported_cache_hits():
    # two turns of one trajectory: 3 of 4 prompt tokens cached, then 5 of 6; another group, 0 of 2
    groups = [
        group([[step(4, 1, cached=3), step(6, 1, cached=5, done=True)]], finals=[1.0]),
        group([[step(2, 1, done=True)]], finals=[0.0]),
    ]
    m = trajectory_metrics(groups, [["chat"], ["math"]])
    assert m["env/all/total_cached_ob_tokens"] == 8.0
    assert m["env/chat/total_cached_ob_tokens"] == 8.0
    assert m["env/math/total_cached_ob_tokens"] == 0.0


def test_golden_per_tag():
    groups, tags = golden_groups()
    m = trajectory_metrics(groups, tags)
    # math = groups A and C: 3 episodes, 3 turns, rewards 1, 0, 0
    assert m["env/math/total_episodes"] == 3.0
    assert m["env/math/reward/total"] == pytest.approx(1 / 3)
    assert m["env/math/by_group/frac_mixed"] == pytest.approx(0.5)
    assert m["env/math/by_group/frac_all_bad"] == pytest.approx(0.5)
    assert m["env/math/correct"] == pytest.approx(1 / 3)
    # chat = group B
    assert m["env/chat/total_turns"] == 3.0
    assert m["env/chat/by_group/frac_all_good"] == 1.0
    assert m["env/chat/format"] == 1.0
    assert "env/chat/correct" not in m
    # env/all is unchanged by tags
    assert {k: v for k, v in m.items() if k.startswith("env/all/")} == trajectory_metrics(groups)
    json.dumps(m)


def test_trivial_tags_are_not_reported():
    groups, _ = golden_groups()
    m = trajectory_metrics(groups, [["rl", "rl"], ["rl"], ["rl"]])
    assert not any(k.startswith("env/rl/") for k in m)
    m = trajectory_metrics(groups, [["rl", "a"], ["rl"], ["rl"]])
    assert m["env/rl/total_episodes"] == 5.0  # reported once some tag is a strict subset
    assert m["env/a/total_episodes"] == 2.0


def test_a_tag_listed_twice_counts_its_group_once():
    # The cookbook appends the group once per listing: math would hold A twice (4 + 1 episodes,
    # reward (1 + 0 + 1 + 0 + 0) / 5) instead of A and C once.
    groups, _ = golden_groups()
    once = trajectory_metrics(groups, [["math"], ["chat"], ["math"]])
    twice = trajectory_metrics(groups, [["math", "math"], ["chat"], ["math"]])
    assert twice == once
    assert twice["env/math/total_episodes"] == 3.0
    assert twice["env/math/reward/total"] == pytest.approx(1 / 3)


def test_empty_batch():
    m = trajectory_metrics([])
    assert m["env/all/total_episodes"] == 0.0
    assert m["env/all/reward/total"] == 0.0
    assert m["env/all/ac_tokens_per_turn"] == 0.0
    assert m["env/all/by_group/frac_mixed"] == 0.0
    json.dumps(m)


def test_good_threshold_boundary():
    g = group([[step(1, 1, done=True)]] * 2, finals=[0.5, 0.5])
    assert trajectory_metrics([g])["env/all/by_group/frac_all_good"] == 1.0
    assert trajectory_metrics([g], good_threshold=0.6)["env/all/by_group/frac_all_bad"] == 1.0


def test_trajectory_metric_errors():
    groups, _ = golden_groups()
    with pytest.raises(ValueError, match="tags_P has 2 entries, groups_P has 3"):
        trajectory_metrics(groups, [["a"], ["b"]])
    with pytest.raises(TypeError, match="not str"):
        trajectory_metrics(groups, ["math", "chat", "math"])


# --- differential against a slow loop reference ---------------------------------------------------


def reference_metrics(groups, tags, good_threshold=0.5):
    """Slow reference written from the cookbook's description, one loop per quantity."""

    def compute(gs):
        turns = episodes = ac = ob = cached = 0
        rewards = []
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        mixed = good = bad = 0
        for g in gs:
            for traj, final in zip(g.trajectories_G, g.final_rewards_G, strict=True):
                episodes += 1
                total = 0.0
                for tr in traj.transitions:
                    turns += 1
                    ac += len(tr.ac.tokens)
                    ob += len(tr.ob.tokens)
                    cached += tr.ac.prompt_cache_hit_tokens
                    total += tr.reward
                    for k, v in tr.metrics.items():
                        sums[k] = sums.get(k, 0.0) + v
                        counts[k] = counts.get(k, 0) + 1
                rewards.append(total + final)
            for metric in g.metrics_G:
                for k, v in metric.items():
                    sums[k] = sums.get(k, 0.0) + v
                    counts[k] = counts.get(k, 0) + 1
            totals = g.get_total_rewards()
            if len(set(totals)) <= 1:
                if totals and totals[0] >= good_threshold:
                    good += 1
                else:
                    bad += 1
            else:
                mixed += 1
        out = {
            "ac_tokens_per_turn": ac / turns if turns else 0.0,
            "ob_tokens_per_turn": ob / turns if turns else 0.0,
            "turns_per_episode": turns / episodes if episodes else 0.0,
            "total_episodes": episodes,
            "total_turns": turns,
            "total_ac_tokens": ac,
            "total_ob_tokens": ob,
            "total_cached_ob_tokens": cached,
            "reward/total": sum(rewards) / len(rewards) if rewards else 0.0,
        }
        for k in sums:
            out[k] = sums[k] / counts[k]
        n = len(gs)
        out["by_group/frac_mixed"] = mixed / n if n else 0.0
        out["by_group/frac_all_good"] = good / n if n else 0.0
        out["by_group/frac_all_bad"] = bad / n if n else 0.0
        return out

    result = {f"env/all/{k}": v for k, v in compute(groups).items()}
    if tags is not None:
        all_tags = sorted({t for ts in tags for t in ts})
        members = {t: [g for g, ts in zip(groups, tags, strict=True) if t in ts] for t in all_tags}
        if any(len(m) < len(groups) for m in members.values()):
            for t, gs in members.items():
                result.update({f"env/{t}/{k}": v for k, v in compute(gs).items()})
    return result


@st.composite
def transitions(draw):
    keys = draw(st.sets(st.sampled_from(["format", "correct", "parse_error_masked"])))
    ob_len = draw(st.integers(0, 5))
    return step(
        ob_len,
        draw(st.integers(0, 4)),  # empty actions included
        reward=draw(st.sampled_from([0.0, 0.25, 1.0, -0.5])),
        metrics={k: draw(st.sampled_from([0, 1, 0.5])) for k in keys},
        cached=draw(st.integers(0, ob_len)),
    )


@st.composite
def groups_and_tags(draw):
    n_groups = draw(st.integers(0, 4))
    groups, tags = [], []
    for _ in range(n_groups):
        size = draw(st.integers(1, 3))  # group size 1 included
        trajs = [draw(st.lists(transitions(), min_size=0, max_size=3)) for _ in range(size)]
        finals = [draw(st.sampled_from([0.0, 0.5, 1.0])) for _ in range(size)]
        metrics_G = [
            {
                k: draw(st.sampled_from([0, 1]))
                for k in draw(st.sets(st.sampled_from(["correct", "stop/length"])))
            }
            for _ in range(size)
        ]
        groups.append(group(trajs, finals, metrics_G))
        tags.append(draw(st.lists(st.sampled_from(["math", "code", "all_envs"]), max_size=2)))
    with_tags = draw(st.booleans())
    return groups, (tags if with_tags else None)


@settings(max_examples=80, deadline=None)
@given(groups_and_tags())
def test_matches_slow_reference(problem):
    groups, tags = problem
    got = trajectory_metrics(groups, tags)
    want = reference_metrics(groups, tags)
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key
    assert all(type(v) is float and math.isfinite(v) for v in got.values())
    assert json.loads(json.dumps(got)) == got
    # Every group is exactly one of mixed / all good / all bad.
    for key in [k for k in got if k.endswith("by_group/frac_mixed")]:
        prefix = key[: -len("frac_mixed")]
        total = got[key] + got[prefix + "frac_all_good"] + got[prefix + "frac_all_bad"]
        has_groups = bool(groups) or not key.startswith("env/all/")
        assert total == pytest.approx(1.0 if has_groups else 0.0)


# --- token-level metrics ---------------------------------------------------------------------------


def test_kl_sample_train_golden_and_padding_garbage():
    q = np.array([[0.0, -1.0, -2.0, np.nan], [0.0, -0.5, np.inf, np.nan]], np.float32)
    lp = np.array([[-9.0, -1.5, -1.0, np.nan], [np.nan, -1.0, np.inf, -np.inf]], np.float32)
    mask = np.array([[0, 1, 1, 0], [0, 1, 0, 0]], np.float32)
    m = kl_sample_train_metrics(q, lp, mask)
    # diffs on action tokens: 0.5, -1.0, 0.5 ; q: -1, -2, -0.5
    assert m["optim/kl_sample_train_v1"] == pytest.approx(0.0)
    assert m["optim/kl_sample_train_v2"] == pytest.approx(0.5 * (0.25 + 1.0 + 0.25) / 3)
    assert m["optim/entropy"] == pytest.approx(3.5 / 3)
    assert all(type(v) is float for v in m.values())
    json.dumps(m)


def test_kl_sample_train_errors():
    with pytest.raises(ValueError, match="no action tokens"):
        kl_sample_train_metrics(jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.zeros((2, 3)))
    with pytest.raises(
        ValueError,
        match=r"kl_sample_train_metrics: training_logprobs_D_T has shape \(2, 4\), "
        r"expected \(2, 3\) \(the shape of sampling_logprobs_D_T\)",
    ):
        kl_sample_train_metrics(jnp.zeros((2, 3)), jnp.zeros((2, 4)), jnp.ones((2, 3)))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 4), st.integers(1, 6))
def test_kl_sample_train_matches_loop_reference(seed, D, T):
    rng = np.random.default_rng(seed)
    mask = (rng.uniform(size=(D, T)) < 0.6).astype(np.float32)
    mask[0, 0] = 1.0
    q = rng.uniform(-5, 0, (D, T)).astype(np.float32)
    lp = (q + rng.normal(scale=0.3, size=(D, T))).astype(np.float32)
    # Pad to a bucket with garbage, as the packed batch would be.

    def pad(x, fill):
        return np.pad(x, ((0, 4 - D), (0, 6 - T)), constant_values=fill)

    got = kl_sample_train_metrics(pad(q, np.nan), pad(lp, np.nan), pad(mask, 0.0))
    diffs, qs = [], []
    for d in range(D):
        for t in range(T):
            if mask[d, t] > 0:
                diffs.append(float(q[d, t]) - float(lp[d, t]))
                qs.append(float(q[d, t]))
    assert got["optim/kl_sample_train_v1"] == pytest.approx(sum(diffs) / len(diffs), abs=1e-5)
    assert got["optim/kl_sample_train_v2"] == pytest.approx(
        0.5 * sum(x * x for x in diffs) / len(diffs), rel=1e-4, abs=1e-6
    )
    assert got["optim/entropy"] == pytest.approx(-sum(qs) / len(qs), rel=1e-5)


def test_sampling_client_metrics():
    m = sampling_client_metrics([3, 5, 4], [1.0, 2.5, 0.5])
    assert m == {
        "sampling_client/step_max": 5.0,
        "sampling_client/step_min": 3.0,
        "sampling_client/step_mean": 4.0,
        "time/sampling_time_max": 2.5,
        "time/sampling_time_min": 0.5,
        "time/sampling_time_mean": pytest.approx(4.0 / 3),
    }
    assert sampling_client_metrics([], []) == {}
    with pytest.raises(ValueError, match="2 steps but 1 times"):
        sampling_client_metrics([1, 2], [1.0])


def test_rollout_error_metrics():
    err = RolloutError(error_type="TimeoutError", error_message="slow")
    other = RolloutError(error_type="ValueError", error_message="bad")
    g1 = TrajectoryGroup(
        trajectories_G=(), final_rewards_G=(), metrics_G=(), rollout_errors=(err, err)
    )
    g2 = TrajectoryGroup(
        trajectories_G=(), final_rewards_G=(), metrics_G=(), rollout_errors=(other,)
    )
    m = rollout_error_metrics([g1, g2], groups_skipped=2)
    assert m == {
        "rollout_errors/TimeoutError": 2.0,
        "rollout_errors/ValueError": 1.0,
        "rollout_errors/total": 3.0,
        "rollout_errors/groups_skipped": 2.0,
    }
    golden, _ = golden_groups()
    assert rollout_error_metrics(golden) == {}
    assert rollout_error_metrics(golden, groups_skipped=1) == {
        "rollout_errors/total": 0.0,
        "rollout_errors/groups_skipped": 1.0,
    }
    with pytest.raises(ValueError, match="groups_skipped"):
        rollout_error_metrics(golden, groups_skipped=-1)


def test_doctests():
    result = doctest.testmod(metrics_module)
    assert result.failed == 0
    assert result.attempted > 0


@pytest.mark.parametrize("mask_shape", [(1, 3), (2, 1), (3,)])
def test_kl_sample_train_refuses_a_mis_shaped_mask(mask_shape):
    """A `[1, T]` or `[D, 1]` mask would broadcast in `jnp.where` without the check."""
    want = (
        f"kl_sample_train_metrics: mask_D_T has shape {mask_shape}, expected (2, 3) "
        "(the shape of sampling_logprobs_D_T)"
    )
    with pytest.raises(ValueError, match=re.escape(want)):
        kl_sample_train_metrics(jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.ones(mask_shape))
