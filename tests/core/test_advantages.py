"""Advantages: invariants (hypothesis), differential tests against slow float64 loop references,
bit-exact parity with a float32 re-implementation of the cookbook formula, golden values, the
trace count, and the loss-aggregation helpers."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpure.advantages import (
    MIN_GROUP_SIZE_BUCKET,
    MIN_GROUPS_BUCKET,
    aggregate_advantages,
    aggregate_batch_token_mean,
    aggregate_constant_length,
    aggregate_sequence_token_mean,
    aggregate_token_sum,
    compute_advantages,
    constant_reward_group_mask,
    group_centered_advantages,
    group_normalized_advantages,
    leave_one_out_advantages,
    pack_rewards,
    remove_constant_reward_groups,
)
from rlpure.packing import DatumBatch
from rlpure.records import ModelInput, TokensWithLogprobs, Trajectory, TrajectoryGroup, Transition
from rlpure.testing import batches, ragged_rewards
from rlpure.testing.reference import reference_group_centered_advantages
from tests.compile_count import count_compiles

F32 = np.float32
U32 = 2.0**-24  # float32 unit roundoff
Ragged = tuple[tuple[float, ...], ...]

# Rewards whose float32 sums are exact (multiples of 1/64 in [-100, 100]), so differences from
# the float64 reference come only from the division and the std, not from summation order.
dyadic_rewards = st.integers(-6400, 6400).map(lambda k: k / 64.0)
dyadic_ragged = st.lists(
    st.lists(dyadic_rewards, min_size=1, max_size=8).map(tuple), min_size=1, max_size=6
).map(tuple)


SHAPE = (8, 16)  # one padded shape for the property tests: one compile per function


def _padded(rewards_P: Ragged, *, shape: tuple[int, int] = SHAPE, junk: float = 0.0):
    """Pads ragged rewards by hand (independently of `pack_rewards`); `junk` fills padding."""
    assert len(rewards_P) <= shape[0] and all(len(r) <= shape[1] for r in rewards_P)
    rewards_P_G = np.full(shape, junk, F32)
    valid_P_G = np.zeros(rewards_P_G.shape, bool)
    for p, rewards_G in enumerate(rewards_P):
        rewards_P_G[p, : len(rewards_G)] = np.asarray(rewards_G, np.float64).astype(F32)
        valid_P_G[p, : len(rewards_G)] = True
    return rewards_P_G, valid_P_G


def _groups(rewards_P: Ragged) -> tuple[TrajectoryGroup, ...]:
    """Groups of empty trajectories whose total rewards are `rewards_P` (final rewards only)."""
    empty = Trajectory(transitions=())
    return tuple(
        TrajectoryGroup(
            trajectories_G=(empty,) * len(r), final_rewards_G=r, metrics_G=({},) * len(r)
        )
        for r in rewards_P
    )


def _step(*, reward: float) -> Transition:
    return Transition(
        ob=ModelInput.from_ints([1, 2]),
        ac=TokensWithLogprobs(tokens=np.array([3]), logprobs=np.array([-0.5])),
        reward=reward,
        episode_done=True,
    )


# --- slow float64 references (plain loops) -----------------------------------------------------


def ref_centered(rewards_G: Sequence[float]) -> list[float]:
    n = len(rewards_G)
    mean = sum(float(F32(r)) for r in rewards_G) / n
    return [float(F32(r)) - mean for r in rewards_G]


def _std(values: Sequence[float], ddof: int) -> float:
    n = len(values)
    if n - ddof <= 0:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - ddof))


def _normalize(centered: list[float], std: float, eps: float) -> list[float]:
    if std + eps == 0 or all(a == 0 for a in centered):
        return [0.0] * len(centered)
    return [a / (std + eps) for a in centered]


def ref_group_normalized(rewards_G: Sequence[float], eps: float, ddof: int) -> list[float]:
    std = _std([float(F32(r)) for r in rewards_G], ddof)
    return _normalize(ref_centered(rewards_G), std, eps)


def ref_batch_normalized(rewards_P: Ragged, eps: float, ddof: int) -> list[list[float]]:
    std = _std([float(F32(r)) for rewards_G in rewards_P for r in rewards_G], ddof)
    return [_normalize(ref_centered(rewards_G), std, eps) for rewards_G in rewards_P]


def ref_leave_one_out(rewards_G: Sequence[float]) -> list[float]:
    n = len(rewards_G)
    if n == 1:
        return [0.0]
    r32 = [float(F32(r)) for r in rewards_G]
    out = []
    for i in range(n):
        others = [r32[j] for j in range(n) if j != i]
        out.append(r32[i] - sum(others) / len(others))
    return out


def cookbook_float32(groups_P: Sequence[TrajectoryGroup]) -> list[np.ndarray]:
    """The cookbook's `rewards_G - rewards_G.mean()` in float32 (`rlpure.testing.reference`'s loops)."""
    return [np.asarray(a_G, F32) for a_G in reference_group_centered_advantages(groups_P)]


def _close(got: float, want: float, scale: float, rel: float) -> bool:
    return abs(got - want) <= rel * max(scale, 1e-30)


# --- golden values -----------------------------------------------------------------------------


def test_golden_group_centered() -> None:
    rewards = ((1.0, 0.0, 0.0, 1.0), (1.0, 0.0, 0.0), (5.0,), (2.0, 2.0))
    got = np.asarray(compute_advantages(_groups(rewards)))
    third = F32(1) / F32(3)  # float32(1/3) = 0.33333334
    want = np.array(
        [
            [0.5, -0.5, -0.5, 0.5],
            [F32(1) - third, -third, -third, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
        ],
        F32,
    )
    assert got.dtype == F32 and got.shape == (4, 4)
    np.testing.assert_array_equal(got, want)
    assert got[1, 0] == F32(0.6666666) and got[1, 1] == F32(-0.33333334)


def test_golden_other_estimators() -> None:
    groups = _groups(((1.0, 0.0, 0.0, 1.0), (3.0,), (0.0, 2.0)))
    loo = np.asarray(compute_advantages(groups, estimator="leave_one_out"))
    np.testing.assert_allclose(
        loo, np.array([[2 / 3, -2 / 3, -2 / 3, 2 / 3], [0, 0, 0, 0], [-2, 2, 0, 0]]), rtol=1e-6
    )
    eps = 1e-6
    norm = np.asarray(compute_advantages(groups, estimator="group_normalized", eps=eps))
    h = 0.5 / (0.5 + eps)
    # group 0: population std 0.5; group 2: centred [-1, 1], std 1.
    np.testing.assert_allclose(
        norm,
        np.array([[h, -h, -h, h], [0, 0, 0, 0], [-1 / (1 + eps), 1 / (1 + eps), 0, 0]]),
        rtol=1e-6,
    )
    batch = np.asarray(compute_advantages(groups, estimator="batch_normalized", eps=eps))
    all_rewards = np.array([1, 0, 0, 1, 3, 0, 2], np.float64)
    std = all_rewards.std()  # population std over the batch: 1.0690...
    b = 0.5 / (std + eps)
    np.testing.assert_allclose(
        batch,
        np.array([[b, -b, -b, b], [0, 0, 0, 0], [-2 * b, 2 * b, 0, 0]]),
        rtol=1e-6,
    )  # fmt: skip
    sample = group_normalized_advantages(
        *_padded(((1.0, 0.0, 0.0, 1.0),)), eps=0.0, scope="group", ddof=1
    )
    np.testing.assert_allclose(
        np.asarray(sample)[0, :4], np.array([0.5, -0.5, -0.5, 0.5]) / math.sqrt(1 / 3), rtol=1e-6
    )


def test_compute_advantages_shape_order_and_errors() -> None:
    groups = _groups(((1.0,), (0.0, 1.0, 1.0, 0.0, 1.0), (1.0, 0.0)))
    got = compute_advantages(groups)
    assert isinstance(got, jax.Array)
    assert got.shape == (3, 5) and got.dtype == jnp.float32
    assert np.asarray(got)[2, 2:].tolist() == [0.0, 0.0, 0.0]
    assert np.asarray(got)[0].tolist() == [0.0] * 5
    assert compute_advantages(()).shape == (0, 0)
    with pytest.raises(ValueError, match=r"unknown estimator 'grpo'"):
        compute_advantages(groups, estimator="grpo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"eps must be finite and >= 0"):
        compute_advantages(groups, estimator="group_normalized", eps=-1.0)
    with pytest.raises(TypeError, match=r"groups_P\[1\]: expected TrajectoryGroup, got tuple"):
        compute_advantages([groups[0], (1.0,)])  # type: ignore[list-item]


def test_pack_rewards_layout() -> None:
    step = _step(reward=0.25)
    traj = Trajectory(transitions=(step, step))
    group = TrajectoryGroup(
        trajectories_G=(traj, Trajectory(transitions=())),
        final_rewards_G=(1.0, 0.1),
        metrics_G=({}, {}),
    )
    empty = TrajectoryGroup(trajectories_G=(), final_rewards_G=(), metrics_G=())
    packed = pack_rewards([group, empty, group])
    assert packed.rewards_P_G.shape == (MIN_GROUPS_BUCKET, MIN_GROUP_SIZE_BUCKET)
    assert packed.num_groups == 3 and packed.max_group_size == 2
    assert packed.group_size_P.tolist() == [2, 0, 2] + [0] * (MIN_GROUPS_BUCKET - 3)
    assert packed.rewards_P_G[0, :2].tolist() == [F32(1.5), F32(0.1)]
    half = [True, True, False, False]
    assert packed.valid_P_G[:3].tolist() == [half, [False] * 4, half]
    assert not packed.valid_P_G[3:].any() and not packed.rewards_P_G[3:].any()
    assert isinstance(packed.rewards_P_G, np.ndarray) and not packed.rewards_P_G.flags.writeable
    big = pack_rewards(_groups(tuple((0.0,) * 5 for _ in range(9))))
    assert big.rewards_P_G.shape == (16, 8)
    assert pack_rewards([]).rewards_P_G.shape == (MIN_GROUPS_BUCKET, MIN_GROUP_SIZE_BUCKET)


def test_remove_constant_reward_groups_golden() -> None:
    a, b, c = _groups(((1.0, 1.0), (0.0, 1.0), (0.5,)))
    assert remove_constant_reward_groups([a, b, c]) == (b,)
    assert remove_constant_reward_groups([a, c]) == (a,)  # all constant: keep the FIRST
    assert remove_constant_reward_groups([c, a]) == (c,)
    assert remove_constant_reward_groups([]) == ()
    # Constancy is decided on float64 totals (0.1 + 0.2 != 0.3 in float64) as in the cookbook,
    # while the float32 mask sees equal values.
    step = _step(reward=0.1)
    traj = Trajectory(transitions=(step,))
    tricky = TrajectoryGroup(
        trajectories_G=(traj, Trajectory(transitions=())),
        final_rewards_G=(0.2, 0.3),
        metrics_G=({}, {}),
    )
    assert tricky.get_total_rewards() == [0.1 + 0.2, 0.3] and 0.1 + 0.2 != 0.3
    assert remove_constant_reward_groups([a, tricky]) == (tricky,)
    packed = pack_rewards([a, tricky])
    mask = np.asarray(constant_reward_group_mask(packed.rewards_P_G, packed.valid_P_G))
    assert mask[:2].tolist() == [True, True]


def test_constant_reward_group_mask_golden() -> None:
    rewards_P_G, valid_P_G = _padded(((1.0, 1.0, 1.0), (1.0, 0.0), (3.0,)), shape=(4, 4), junk=7.0)
    mask = np.asarray(constant_reward_group_mask(rewards_P_G, valid_P_G))
    assert mask.tolist() == [True, False, True, True]  # empty padding row counts as constant


# --- invariants (hypothesis) -------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(rewards_P=ragged_rewards(reward_kind="float", max_group_size=8))
def test_centered_sums_to_zero_and_group_of_one(rewards_P: Ragged) -> None:
    rewards_P_G, valid_P_G = _padded(rewards_P)
    adv_P_G = np.asarray(group_centered_advantages(rewards_P_G, valid_P_G))
    for p, rewards_G in enumerate(rewards_P):
        scale = sum(abs(float(F32(r))) for r in rewards_G)
        total = float(np.sum(adv_P_G[p].astype(np.float64)))
        assert abs(total) <= 4 * len(rewards_G) * U32 * max(scale, 1.0), (rewards_G, total)
        if len(rewards_G) == 1:
            assert adv_P_G[p, 0] == 0.0
        if len(set(rewards_G)) == 1:  # constant group: zero up to the rounding of the sum
            assert np.all(np.abs(adv_P_G[p]) <= 2 * len(rewards_G) * U32 * max(scale, 1.0))


@settings(max_examples=60, deadline=None)
@given(
    rewards_P=ragged_rewards(reward_kind="binary", max_group_size=16),
    shifts=st.lists(st.integers(-1000, 1000), min_size=6, max_size=6),
)
def test_centered_shift_invariance(rewards_P: Ragged, shifts: list[int]) -> None:
    """Exact for power-of-two group sizes (the mean S/G is then exact before and after the
    shift); otherwise only up to the rounding of the shifted mean (≤ 1 ulp of |R + k|): in
    float32, `(R + k) - fl((S + kG)/G)` and `R - fl(S/G)` round the mean at different
    magnitudes. The cookbook's torch formula has exactly the same behaviour."""
    shifted = tuple(
        tuple(r + k for r in rewards_G) for rewards_G, k in zip(rewards_P, shifts, strict=False)
    )
    base = np.asarray(group_centered_advantages(*_padded(rewards_P)))
    moved = np.asarray(group_centered_advantages(*_padded(shifted)))
    for p, (rewards_G, k) in enumerate(zip(rewards_P, shifts, strict=False)):
        n = len(rewards_G)
        if n & (n - 1) == 0:
            np.testing.assert_array_equal(moved[p], base[p])
        else:
            ulp = float(np.spacing(F32(abs(k) + 1)))
            np.testing.assert_allclose(moved[p], base[p], rtol=0, atol=ulp)


@settings(max_examples=60, deadline=None)
@given(rewards_P=dyadic_ragged, ddof=st.sampled_from((0, 1)))
def test_normalized_has_unit_std(rewards_P: Ragged, ddof: int) -> None:
    eps = 1e-6
    rewards_P_G, valid_P_G = _padded(rewards_P)
    adv_P_G = np.asarray(
        group_normalized_advantages(rewards_P_G, valid_P_G, eps=eps, scope="group", ddof=ddof)
    )
    for p, rewards_G in enumerate(rewards_P):
        row = adv_P_G[p, : len(rewards_G)].astype(np.float64)
        std = _std(list(rewards_G), ddof)
        if len(set(rewards_G)) == 1 or len(rewards_G) <= ddof:
            assert not row.any()
        else:
            assert abs(_std(list(row), ddof) - std / (std + eps)) <= 1e-5
            assert abs(_std(list(row), ddof) - 1.0) <= 1e-5 + eps / std


_ESTIMATOR_FNS: dict[str, Callable[[np.ndarray, np.ndarray], jax.Array]] = {
    "group_centered": group_centered_advantages,
    "leave_one_out": leave_one_out_advantages,
    "group_normalized": lambda r, v: group_normalized_advantages(r, v, scope="group"),
    "batch_normalized": lambda r, v: group_normalized_advantages(r, v, scope="batch"),
}


@settings(max_examples=40, deadline=None)
@given(
    rewards_P=ragged_rewards(reward_kind="float", max_group_size=8),
    junk=st.sampled_from((1e30, -3.5, float("nan"))),
)
def test_padding_values_never_leak(rewards_P: Ragged, junk: float) -> None:
    """Junk (huge, negative, even NaN) in padding changes nothing; padding outputs are 0."""
    clean = _padded(rewards_P)
    dirty = _padded(rewards_P, junk=junk)
    for name, fn in _ESTIMATOR_FNS.items():
        want = np.asarray(fn(*clean))
        got = np.asarray(fn(*dirty))
        np.testing.assert_array_equal(got, want, err_msg=name)
        assert not got[~dirty[1]].any(), name
    np.testing.assert_array_equal(
        np.asarray(constant_reward_group_mask(*dirty)),
        np.asarray(constant_reward_group_mask(*clean)),
    )


@settings(max_examples=30, deadline=None)
@given(
    rewards_P=ragged_rewards(reward_kind="binary", max_group_size=8), float_rewards=dyadic_ragged
)
def test_padded_shape_changes_at_most_rounding(rewards_P: Ragged, float_rewards: Ragged) -> None:
    """Exact sums (0/1): identical results for every padded shape. Otherwise the bucket may
    change the reduction order, hence the last bits (never more)."""
    p, g = len(rewards_P), max(len(r) for r in rewards_P)
    small = np.asarray(group_centered_advantages(*_padded(rewards_P)))[:p, :g]
    large = np.asarray(group_centered_advantages(*_padded(rewards_P, shape=(16, 32))))[:p, :g]
    np.testing.assert_array_equal(small, large)
    p, g = len(float_rewards), max(len(r) for r in float_rewards)
    for name, fn in _ESTIMATOR_FNS.items():
        small = np.asarray(fn(*_padded(float_rewards)))[:p, :g]
        large = np.asarray(fn(*_padded(float_rewards, shape=(16, 32))))[:p, :g]
        np.testing.assert_allclose(small, large, rtol=1e-6, atol=1e-6, err_msg=name)


# --- differential tests against the float64 loop references -----------------------------------


@settings(max_examples=60, deadline=None)
@given(rewards_P=ragged_rewards(reward_kind="float", max_group_size=8))
def test_centered_matches_reference_float_rewards(rewards_P: Ragged) -> None:
    """Within 1e-6 of the group's reward magnitude sum(|R|) for arbitrary float32 rewards."""
    adv_P_G = np.asarray(group_centered_advantages(*_padded(rewards_P)))
    for p, rewards_G in enumerate(rewards_P):
        scale = sum(abs(float(F32(r))) for r in rewards_G)
        for g, want in enumerate(ref_centered(rewards_G)):
            assert _close(float(adv_P_G[p, g]), want, scale, 1e-6), (rewards_G, g)


@settings(max_examples=60, deadline=None)
@given(rewards_P=dyadic_ragged, eps=st.sampled_from((0.0, 1e-6, 0.1)), ddof=st.sampled_from((0, 1)))
def test_estimators_match_references(rewards_P: Ragged, eps: float, ddof: int) -> None:
    rewards_P_G, valid_P_G = _padded(rewards_P)
    centered = np.asarray(group_centered_advantages(rewards_P_G, valid_P_G))
    loo = np.asarray(leave_one_out_advantages(rewards_P_G, valid_P_G))
    group = np.asarray(
        group_normalized_advantages(rewards_P_G, valid_P_G, eps=eps, scope="group", ddof=ddof)
    )
    batch = np.asarray(
        group_normalized_advantages(rewards_P_G, valid_P_G, eps=eps, scope="batch", ddof=ddof)
    )
    mask = np.asarray(constant_reward_group_mask(rewards_P_G, valid_P_G))
    batch_ref = ref_batch_normalized(rewards_P, eps, ddof)
    for p, rewards_G in enumerate(rewards_P):
        n = len(rewards_G)
        scale = max(abs(r) for r in rewards_G) + 1.0
        np.testing.assert_allclose(
            centered[p, :n], ref_centered(rewards_G), rtol=0, atol=1e-6 * scale
        )
        np.testing.assert_allclose(
            loo[p, :n], ref_leave_one_out(rewards_G), rtol=0, atol=2e-6 * scale
        )
        np.testing.assert_allclose(
            group[p, :n], ref_group_normalized(rewards_G, eps, ddof), rtol=1e-5, atol=1e-5
        )
        np.testing.assert_allclose(batch[p, :n], batch_ref[p], rtol=1e-5, atol=1e-5)
        assert bool(mask[p]) == all(r == rewards_G[0] for r in rewards_G)
        np.testing.assert_allclose(loo[p, :n], centered[p, :n] * (n / (n - 1) if n > 1 else 0.0), atol=4e-6 * scale)  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(
    groups_P=batches(reward_kind="float", max_turns=2, max_group_size=6),
    estimator=st.sampled_from(("group_centered", "group_normalized", "batch_normalized", "leave_one_out")),
)  # fmt: skip
def test_compute_advantages_matches_reference_on_trajectories(groups_P, estimator: str) -> None:
    """End to end from records: totals (step rewards + final reward) then the estimator."""
    got = np.asarray(compute_advantages(groups_P, estimator=estimator))  # type: ignore[arg-type]
    totals_P = tuple(tuple(g.get_total_rewards()) for g in groups_P)
    assert got.shape == (len(groups_P), max(len(t) for t in totals_P))
    # The reference sees the same float32-rounded totals as the implementation.
    r32_P = tuple(tuple(float(F32(r)) for r in t) for t in totals_P)
    batch_ref = ref_batch_normalized(r32_P, 1e-6, 0)
    for p, rewards_G in enumerate(r32_P):
        n = len(rewards_G)
        assert not got[p, n:].any()
        scale = sum(abs(r) for r in rewards_G)
        if estimator == "group_centered":
            for g, want in enumerate(ref_centered(rewards_G)):
                assert _close(float(got[p, g]), want, scale, 1e-6)
        elif estimator == "leave_one_out":
            for g, want in enumerate(ref_leave_one_out(rewards_G)):
                assert _close(float(got[p, g]), want, scale, 2e-6)
        else:
            # Normalised estimators divide by a std that may be tiny compared with the rewards
            # (catastrophic cancellation); compare the scale-free quantity A * (std + eps).
            if estimator == "group_normalized":
                std = _std(list(rewards_G), 0)
                want_G = ref_group_normalized(rewards_G, 1e-6, 0)
            else:
                std = _std([r for t in r32_P for r in t], 0)
                want_G = batch_ref[p]
            for g, want in enumerate(want_G):
                got_scaled = float(got[p, g]) * (std + 1e-6)
                assert _close(got_scaled, want * (std + 1e-6), scale, 2e-6), (rewards_G, g)


@settings(max_examples=60, deadline=None)
@given(groups_P=batches(reward_kind="binary", max_group_size=8, max_groups=6))
def test_compute_advantages_bit_equal_to_cookbook_float32(groups_P) -> None:
    """0/1 step and final rewards: integer totals, exact group sums, so results are bit-equal."""
    got = np.asarray(compute_advantages(groups_P))
    for p, want_G in enumerate(cookbook_float32(groups_P)):
        np.testing.assert_array_equal(got[p, : want_G.size], want_G)
        assert not got[p, want_G.size :].any()


def test_bit_equal_exhaustively_for_small_groups() -> None:
    """Every group size 1..64 and every number of 1-rewards: exactly the cookbook's float32."""
    rewards_P = tuple(
        tuple([1.0] * s + [0.0] * (n - s)) for n in range(1, 65) for s in range(n + 1)
    )
    groups_P = _groups(rewards_P)
    got = np.asarray(compute_advantages(groups_P))
    for p, want_G in enumerate(cookbook_float32(groups_P)):
        np.testing.assert_array_equal(got[p, : want_G.size], want_G)


@settings(max_examples=40, deadline=None)
@given(groups_P=batches(reward_kind="binary", max_turns=2))
def test_remove_constant_reward_groups_matches_cookbook(groups_P) -> None:
    def all_same(xs: list[float]) -> bool:
        return all(x == xs[0] for x in xs)

    kept = [g for g in groups_P if not all_same(g.get_total_rewards())]
    want = tuple(kept) if kept else tuple(groups_P[:1])
    got = remove_constant_reward_groups(groups_P)
    assert len(got) == len(want) and all(a is b for a, b in zip(got, want, strict=True))
    packed = pack_rewards(groups_P)
    mask = np.asarray(constant_reward_group_mask(packed.rewards_P_G, packed.valid_P_G))
    # Integer totals: float32 and float64 constancy agree.
    assert mask[: len(groups_P)].tolist() == [all_same(g.get_total_rewards()) for g in groups_P]


# --- compile count -----------------------------------------------------------------------------


def test_new_batch_size_in_same_bucket_does_not_recompile() -> None:
    """P = 3 and P = 5 (bucket 8), G = 3 and G = 4 (bucket 4): nothing compiles the 2nd time."""
    first = _groups(((1.0, 0.0, 1.0),) * 3)
    second = _groups(((0.0, 1.0), (1.0, 1.0, 0.0, 0.0), (1.0,), (0.0, 0.0, 1.0), (1.0, 0.0)))
    estimators = ("group_centered", "group_normalized", "batch_normalized", "leave_one_out")
    for estimator in estimators:
        compute_advantages(first, estimator=estimator)  # type: ignore[arg-type]  # warm up

    def run() -> None:
        for estimator in estimators:
            compute_advantages(second, estimator=estimator, eps=0.5).block_until_ready()  # type: ignore[arg-type]

    with count_compiles() as compiled:
        run()
    assert compiled.traces_of(group_centered_advantages) == 0
    assert dict(compiled.backend_compiles) == {}
    # Sanity: the counter does see compiles (a fresh function always compiles).
    fresh = jax.jit(lambda x: x * 3.0 + 1.0)
    with count_compiles() as compiled:
        fresh(np.zeros(3, F32)).block_until_ready()
    assert sum(compiled.backend_compiles.values()) == 1


# --- loss aggregation --------------------------------------------------------------------------


def _datum_batch(advantages_D_T, mask_D_T, *, as_jax: bool = False) -> DatumBatch:
    advantages_D_T = np.asarray(advantages_D_T, F32)
    mask_D_T = np.asarray(mask_D_T, F32)
    d, t = advantages_D_T.shape
    length_D = np.full(d, t, np.int32)
    conv = jnp.asarray if as_jax else (lambda x: x)
    return DatumBatch(
        input_tokens_D_T=conv(np.ones((d, t), np.int32)),
        target_tokens_D_T=conv(np.ones((d, t), np.int32)),
        logprobs_D_T=conv(np.zeros((d, t), F32)),
        advantages_D_T=conv(advantages_D_T),
        mask_D_T=conv(mask_D_T),
        length_D=conv(length_D),
        group_idx_D=conv(np.zeros(d, np.int32)),
        traj_idx_D=conv(np.zeros(d, np.int32)),
        num_datums=d,
    )


_GOLDEN_MASK = [[0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
_GOLDEN_ADV = [[0, 2, 2, 0], [-1, -1, -1, -1], [0, 0, 0, 0]]


def test_aggregation_golden() -> None:
    batch = _datum_batch(_GOLDEN_ADV, _GOLDEN_MASK)
    same = aggregate_token_sum(batch)
    assert same is not batch and same.advantages_D_T is batch.advantages_D_T
    seq = aggregate_sequence_token_mean(batch)
    np.testing.assert_array_equal(seq.advantages_D_T, [[0, 1, 1, 0], [-0.25] * 4, [0] * 4])
    tok = aggregate_batch_token_mean(batch)
    np.testing.assert_array_equal(
        tok.advantages_D_T, np.array(_GOLDEN_ADV, F32) / F32(6)
    )  # 6 trained tokens in the batch
    const = aggregate_constant_length(batch, length=8)
    np.testing.assert_array_equal(const.advantages_D_T, np.array(_GOLDEN_ADV, F32) / F32(8))
    for out in (seq, tok, const):
        assert isinstance(out.advantages_D_T, np.ndarray) and out.advantages_D_T.dtype == F32
        assert out.mask_D_T is batch.mask_D_T and out.input_tokens_D_T is batch.input_tokens_D_T
        assert out.num_datums == batch.num_datums
    np.testing.assert_array_equal(batch.advantages_D_T, np.array(_GOLDEN_ADV, F32))  # untouched


def test_aggregation_dispatcher_and_errors() -> None:
    batch = _datum_batch(_GOLDEN_ADV, _GOLDEN_MASK)
    for mode, want in (
        ("token_sum", aggregate_token_sum(batch)),
        ("sequence_token_mean", aggregate_sequence_token_mean(batch)),
        ("batch_token_mean", aggregate_batch_token_mean(batch)),
    ):
        got = aggregate_advantages(batch, mode=mode)  # type: ignore[arg-type]
        np.testing.assert_array_equal(got.advantages_D_T, want.advantages_D_T)
    got = aggregate_advantages(batch, mode="constant_length", length=4.0)
    np.testing.assert_array_equal(got.advantages_D_T, np.array(_GOLDEN_ADV, F32) / 4)
    with pytest.raises(ValueError, match=r"unknown mode 'mean'"):
        aggregate_advantages(batch, mode="mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"length is required"):
        aggregate_advantages(batch, mode="constant_length")
    with pytest.raises(ValueError, match=r"length is required"):
        aggregate_advantages(batch, mode="token_sum", length=3.0)
    with pytest.raises(ValueError, match=r"length must be finite and > 0"):
        aggregate_constant_length(batch, length=0.0)
    jax_batch = _datum_batch(_GOLDEN_ADV, _GOLDEN_MASK, as_jax=True)
    out = aggregate_sequence_token_mean(jax_batch)
    assert isinstance(out.advantages_D_T, jax.Array)
    np.testing.assert_array_equal(
        np.asarray(out.advantages_D_T), [[0, 1, 1, 0], [-0.25] * 4, [0] * 4]
    )


@settings(max_examples=40, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 5), st.integers(1, 7)),
    seed=st.integers(0, 2**31),
    length=st.floats(0.5, 512.0),
)
def test_aggregation_matches_reference(shape: tuple[int, int], seed: int, length: float) -> None:
    rng = np.random.default_rng(seed)
    # One padded shape (one compile); rows/columns beyond `shape` are padding (mask 0).
    real = np.zeros((5, 7), bool)
    real[: shape[0], : shape[1]] = True
    mask = ((rng.random(real.shape) < 0.6) & real).astype(F32)
    adv = np.where(mask > 0, rng.normal(size=real.shape), 0.0).astype(F32)
    shape = real.shape
    batch = _datum_batch(adv, mask)
    seq = np.asarray(aggregate_sequence_token_mean(batch).advantages_D_T)
    tok = np.asarray(aggregate_batch_token_mean(batch).advantages_D_T)
    const = np.asarray(aggregate_constant_length(batch, length=length).advantages_D_T)
    total = sum(float(m) for row in mask for m in row)
    for d in range(shape[0]):
        count = sum(float(m) for m in mask[d])
        for t in range(shape[1]):
            a = float(adv[d, t])
            assert math.isclose(seq[d, t], a / count if count else 0.0, rel_tol=1e-6, abs_tol=1e-12)
            assert math.isclose(tok[d, t], a / total if total else 0.0, rel_tol=1e-6, abs_tol=1e-12)
            assert math.isclose(const[d, t], a / length, rel_tol=1e-6, abs_tol=1e-12)
        # The token-summed loss weight of a datum under sequence mean is its mean advantage.
        if count:
            assert math.isclose(
                float(np.sum(seq[d] * mask[d], dtype=np.float64)),
                sum(float(adv[d, t]) for t in range(shape[1])) / count,
                rel_tol=1e-5,
                abs_tol=1e-6,
            )


def test_aggregation_inside_jit() -> None:
    """The helpers compose with a jitted loss: `DatumBatch` is a pytree."""
    batch = _datum_batch(_GOLDEN_ADV, _GOLDEN_MASK, as_jax=True)

    @jax.jit
    def weighted(batch: DatumBatch) -> jax.Array:
        for mode in ("sequence_token_mean", "batch_token_mean"):
            batch = aggregate_advantages(batch, mode=mode)  # type: ignore[arg-type]
        return jnp.sum(batch.advantages_D_T * batch.mask_D_T)

    # sequence mean: datum 0 -> [1, 1], datum 1 -> [-0.25] * 4; then / 6 trained tokens.
    assert math.isclose(float(weighted(batch)), (2.0 - 1.0) / 6.0, rel_tol=1e-6)


# --- shape checks: a mis-shaped mask is refused, not broadcast --------------------------------

_CHECKED_ESTIMATORS: dict[str, Callable[[np.ndarray, np.ndarray], jax.Array]] = {
    "group_centered_advantages": group_centered_advantages,
    "group_normalized_advantages": group_normalized_advantages,
    "leave_one_out_advantages": leave_one_out_advantages,
    "constant_reward_group_mask": constant_reward_group_mask,
}


@pytest.mark.parametrize("name", sorted(_CHECKED_ESTIMATORS))
@pytest.mark.parametrize("valid_shape", [(1, 4), (8, 1), (4, 8)])
def test_estimators_refuse_a_mis_shaped_valid_mask(name: str, valid_shape: tuple[int, int]) -> None:
    """A `[1, G]` or `[P, 1]` mask used to broadcast silently against `[P, G]` rewards."""
    rewards_P_G, _ = _padded(((1.0, 0.0, 1.0),), shape=(8, 4))
    want = f"{name}: valid_P_G has shape {valid_shape}, expected (8, 4) (the shape of rewards_P_G)"
    with pytest.raises(ValueError, match=re.escape(want)):
        _CHECKED_ESTIMATORS[name](rewards_P_G, np.ones(valid_shape, bool))
    # The check runs at trace time, so it also holds inside a caller's `jit`.
    with pytest.raises(ValueError, match=re.escape(want)):
        jax.jit(_CHECKED_ESTIMATORS[name])(rewards_P_G, np.ones(valid_shape, bool))


@pytest.mark.parametrize("name", sorted(_CHECKED_ESTIMATORS))
def test_estimators_refuse_rewards_that_are_not_P_by_G(name: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"{name}: rewards_P_G must be [P, G]")):
        _CHECKED_ESTIMATORS[name](np.zeros((2, 2, 4), F32), np.ones((2, 2, 4), bool))


@pytest.mark.parametrize("mode", ["sequence_token_mean", "batch_token_mean"])
@pytest.mark.parametrize("mask_shape", [(1, 4), (3, 1)])
def test_aggregations_refuse_a_mis_shaped_mask(mode: str, mask_shape: tuple[int, int]) -> None:
    """A `[1, T]` or `[D, 1]` mask used to broadcast (sequence mean) or be summed whole (batch
    mean) without complaint."""
    batch = _datum_batch(_GOLDEN_ADV, _GOLDEN_MASK)
    bad = msgspec.structs.replace(batch, mask_D_T=np.ones(mask_shape, F32))
    want = (
        f"aggregate_{mode}: batch.mask_D_T has shape {mask_shape}, expected (3, 4) "
        "(the shape of batch.advantages_D_T)"
    )
    function = {
        "sequence_token_mean": aggregate_sequence_token_mean,
        "batch_token_mean": aggregate_batch_token_mean,
    }[mode]
    with pytest.raises(ValueError, match=re.escape(want)):
        function(bad)
    with pytest.raises(ValueError, match=re.escape(want)):
        aggregate_advantages(bad, mode=mode)  # type: ignore[arg-type]
