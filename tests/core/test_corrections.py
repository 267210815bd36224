"""Tests for rlpure.corrections: properties, float64 loop references, gradients, errors."""

from __future__ import annotations

import doctest
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

import rlpure.corrections as corrections_module
from rlpure.corrections import KLEstimator, importance_weights, kl_estimate, overlong_penalty
from rlpure.losses import importance_sampling_loss
from rlpure.metrics import kl_sample_train_metrics
from tests.compile_count import count_compiles

LEVELS = ("token", "sequence", "geometric")
MODES = ("truncate", "mask")
PAD_D, PAD_T = 4, 6  # drawn arrays have this shape (one compile per static option)


@st.composite
def mismatched_logprobs(draw, *, one_token_rows: bool = False):
    """Sampler and trainer logprobs `[PAD_D, PAD_T]`, a mask (rows without tokens included),
    garbage (NaN or finite) off the mask."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if one_token_rows:
        mask = np.zeros((PAD_D, PAD_T), np.float32)
        mask[np.arange(PAD_D), rng.integers(0, PAD_T, PAD_D)] = 1.0
    else:
        mask = rng.uniform(size=(PAD_D, PAD_T)) < draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))
        mask = mask.astype(np.float32)
    sampler = rng.uniform(-4.0, 0.0, (PAD_D, PAD_T))
    scale = draw(st.sampled_from([0.0, 0.05, 0.5, 1.5]))
    trainer = sampler + rng.normal(scale=scale, size=sampler.shape)
    # off the mask: NaN, or finite garbage (a sampler of 0 against trainer values, as the
    # loop's observation positions), that no masking-free formula could ignore
    finite = draw(st.booleans())
    off_sampler = 0.0 if finite else np.nan
    off_trainer = rng.uniform(-8.0, -2.0, sampler.shape) if finite else np.nan
    sampler = np.where(mask > 0, sampler, off_sampler).astype(np.float32)
    trainer = np.where(mask > 0, trainer, off_trainer).astype(np.float32)
    return sampler, trainer, mask


def reference_weights(sampler, trainer, mask, *, level, mode, cap):
    """Slow float64 reference: Python loops over rows and tokens."""
    num_d, num_t = mask.shape
    weights = np.ones((num_d, num_t))
    for d in range(num_d):
        on = [t for t in range(num_t) if mask[d, t] > 0]
        deltas = {t: float(trainer[d, t]) - float(sampler[d, t]) for t in on}
        for t in on:
            if level == "token":
                log_ratio = deltas[t]
            elif level == "sequence":
                log_ratio = sum(deltas.values())
            else:
                log_ratio = sum(deltas.values()) / len(on)
            ratio = math.exp(log_ratio)
            if mode == "truncate":
                weights[d, t] = min(ratio, cap)
            else:
                weights[d, t] = ratio if 1.0 / cap <= ratio <= cap else 0.0
    return weights


@settings(max_examples=60, deadline=None)
@given(
    mismatched_logprobs(),
    st.sampled_from(LEVELS),
    st.sampled_from(MODES),
    st.sampled_from([1.0, 1.2, 3.0, 10.0]),
)
def test_weights_match_a_float64_loop_reference(problem, level, mode, cap):
    sampler, trainer, mask = problem
    out = importance_weights(sampler, trainer, mask, level=level, mode=mode, cap=cap)
    want = reference_weights(sampler, trainer, mask, level=level, mode=mode, cap=cap)
    got = np.asarray(out.weights_D_T)
    # a ratio within float32 rounding of a threshold may fall either side of it
    near = np.abs(np.abs(np.log(np.maximum(want, 1e-30))) - math.log(cap)) < 1e-4
    ok = np.isclose(got, want, rtol=1e-4, atol=1e-6) | (near & (mode == "mask"))
    assert ok.all(), (got, want)
    assert np.all(got[mask == 0] == 1.0)


@settings(max_examples=40, deadline=None)
@given(mismatched_logprobs(), st.sampled_from(LEVELS))
def test_truncation_at_an_infinite_cap_is_the_identity(problem, level):
    sampler, trainer, mask = problem
    out = importance_weights(sampler, trainer, mask, level=level, mode="truncate", cap=math.inf)
    raw = reference_weights(sampler, trainer, mask, level=level, mode="truncate", cap=math.inf)
    np.testing.assert_allclose(out.weights_D_T, raw, rtol=1e-4)
    assert float(out.metrics["mismatch/rollout_is_masked_fraction"]) == 0.0
    assert float(out.metrics["mismatch/rollout_is_ratio_fraction_high"]) == 0.0


@settings(max_examples=40, deadline=None)
@given(
    mismatched_logprobs(),
    st.sampled_from(LEVELS),
    st.sampled_from(MODES),
    st.sampled_from([1.0, 2.0, math.inf]),
)
def test_identical_logprobs_give_weights_of_one_and_mask_nothing(problem, level, mode, cap):
    sampler, _, mask = problem
    out = importance_weights(sampler, sampler, mask, level=level, mode=mode, cap=cap)
    np.testing.assert_array_equal(out.weights_D_T, np.ones(mask.shape))
    metrics = {k: float(v) for k, v in out.metrics.items()}
    assert metrics["mismatch/rollout_is_masked_fraction"] == 0.0
    assert metrics["mismatch/rollout_is_seq_masked_fraction"] == 0.0
    assert metrics["mismatch/rollout_is_ratio_fraction_high"] == 0.0
    assert metrics["mismatch/rollout_is_ratio_fraction_low"] == 0.0
    assert metrics["mismatch/rollout_is_mean"] == 1.0


@settings(max_examples=40, deadline=None)
@given(mismatched_logprobs(), st.sampled_from(["sequence", "geometric"]))
def test_sequence_levels_mask_whole_rows(problem, level):
    sampler, trainer, mask = problem
    out = importance_weights(sampler, trainer, mask, level=level, mode="mask", cap=1.5)
    weights = np.asarray(out.weights_D_T)
    rows_masked = 0
    for d in range(PAD_D):
        on = weights[d][mask[d] > 0]
        assert np.all(on == 0.0) or np.all(on > 0.0)  # all or nothing per row
        rows_masked += int(on.size > 0 and np.all(on == 0.0))
    with_tokens = int(np.sum(mask.any(1)))
    want = rows_masked / with_tokens if with_tokens else 0.0
    got = float(out.metrics["mismatch/rollout_is_seq_masked_fraction"])
    assert got == pytest.approx(want)
    # the token fraction counts the tokens of the masked rows
    tokens = sum(int(mask[d].sum()) for d in range(PAD_D) if np.all(weights[d][mask[d] > 0] == 0))
    want_tokens = tokens / mask.sum() if mask.sum() else 0.0
    got_tokens = float(out.metrics["mismatch/rollout_is_masked_fraction"])
    assert got_tokens == pytest.approx(want_tokens)


@settings(max_examples=40, deadline=None)
@given(mismatched_logprobs(one_token_rows=True), st.sampled_from(MODES))
def test_geometric_equals_sequence_for_one_token_rows(problem, mode):
    sampler, trainer, mask = problem
    geometric = importance_weights(sampler, trainer, mask, level="geometric", mode=mode, cap=2.0)
    sequence = importance_weights(sampler, trainer, mask, level="sequence", mode=mode, cap=2.0)
    token = importance_weights(sampler, trainer, mask, level="token", mode=mode, cap=2.0)
    np.testing.assert_array_equal(geometric.weights_D_T, sequence.weights_D_T)
    np.testing.assert_array_equal(token.weights_D_T, sequence.weights_D_T)


def test_golden_metrics():
    # row 0: token log ratios 0, ln 4 (masked in), row 1: ln(1/4), one token; row 2 padding
    ln4 = math.log(4.0)
    sampler = np.zeros((3, 2), np.float32)
    trainer = np.array([[0.0, ln4], [-ln4, np.nan], [np.nan, np.nan]], np.float32)
    mask = np.array([[1, 1], [1, 0], [0, 0]], np.float32)
    out = importance_weights(sampler, trainer, mask, level="token", mode="mask", cap=3.0)
    np.testing.assert_allclose(out.weights_D_T, [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    metrics = {k.removeprefix("mismatch/rollout_is_"): float(v) for k, v in out.metrics.items()}
    assert metrics["mean"] == pytest.approx((1.0 + 4.0 + 0.25) / 3)
    assert metrics["min"] == pytest.approx(0.25)
    assert metrics["max"] == pytest.approx(4.0)
    assert metrics["ratio_fraction_high"] == pytest.approx(1 / 3)
    assert metrics["ratio_fraction_low"] == pytest.approx(1 / 3)
    assert metrics["masked_fraction"] == pytest.approx(2 / 3)
    assert metrics["seq_masked_fraction"] == pytest.approx(1.0)  # both rows with tokens lost one
    truncated = importance_weights(sampler, trainer, mask, level="token", mode="truncate", cap=3)
    np.testing.assert_allclose(truncated.weights_D_T, [[1.0, 3.0], [0.25, 1.0], [1.0, 1.0]])
    assert float(truncated.metrics["mismatch/rollout_is_masked_fraction"]) == 0.0


def test_no_tokens_gives_neutral_metrics():
    nan = np.full((2, 3), np.nan, np.float32)
    out = importance_weights(nan, nan, np.zeros((2, 3)), level="geometric", mode="mask", cap=2.0)
    np.testing.assert_array_equal(out.weights_D_T, np.ones((2, 3)))
    assert all(np.isfinite(float(v)) for v in out.metrics.values())


def test_cap_is_traced_once_per_level_and_mode():
    sampler, trainer, mask = np.zeros((2, 3)), np.ones((2, 3)), np.ones((2, 3))
    corrections_module._importance_weights.clear_cache()  # type: ignore[attr-defined]
    with count_compiles() as compiled:
        for cap in (1.5, 2.0, 3.0, math.inf):
            importance_weights(sampler, trainer, mask, level="token", mode="mask", cap=cap)
    assert compiled.traces_of(corrections_module._importance_weights) == 1


# --- gradients ----------------------------------------------------------------------------------


def test_weights_carry_no_gradient():
    rng = np.random.default_rng(0)
    sampler = jnp.asarray(rng.uniform(-3, 0, (3, 4)), jnp.float32)
    trainer = sampler + jnp.asarray(rng.normal(scale=0.8, size=(3, 4)), jnp.float32)
    mask = jnp.asarray(rng.uniform(size=(3, 4)) < 0.7, jnp.float32)

    def weight_sum(trainer_lp):
        out = importance_weights(sampler, trainer_lp, mask, level="sequence", mode="truncate")
        return jnp.sum(out.weights_D_T)

    np.testing.assert_array_equal(jax.grad(weight_sum)(trainer), np.zeros((3, 4)))


@pytest.mark.parametrize(("level", "mode"), [("token", "truncate"), ("sequence", "mask")])
def test_the_corrected_loss_gradient_is_minus_w_times_a_at_the_trainers_logprobs(level, mode):
    """TIS/MIS: `∂L/∂lp = −w·A` at `lp = trainer`, when the loss's behaviour logprobs (the
    datum's `logprobs`) are the trainer's; with the sampler's there Tinker's ratio
    `exp(lp − q)` multiplies the weight again (`−r·w·A`)."""
    rng = np.random.default_rng(0)
    sampler = jnp.asarray(rng.uniform(-3, 0, (3, 4)), jnp.float32)
    trainer = sampler + jnp.asarray(rng.normal(scale=0.8, size=(3, 4)), jnp.float32)
    mask = jnp.asarray(rng.uniform(size=(3, 4)) < 0.7, jnp.float32)
    advantages = jnp.asarray(rng.normal(size=(3, 4)), jnp.float32) * mask
    w = importance_weights(sampler, trainer, mask, level=level, mode=mode, cap=2.0).weights_D_T
    assert not np.allclose(np.asarray(w)[np.asarray(mask) > 0], 1.0)  # the weights matter

    def corrected_loss(lp, behaviour):
        return importance_sampling_loss(lp, behaviour, advantages * w, valid_mask_D_T=mask).loss

    want = np.where(mask > 0, -np.asarray(w) * np.asarray(advantages), 0.0)
    np.testing.assert_allclose(jax.grad(corrected_loss)(trainer, trainer), want, rtol=1e-6)
    # the double count the loop avoids: sampler logprobs as the behaviour policy
    doubled = jax.grad(corrected_loss)(trainer, sampler)
    ratio = np.exp(np.asarray(trainer) - np.asarray(sampler))
    np.testing.assert_allclose(doubled, want * ratio, rtol=1e-5)
    # the reviewer's case: sampler -1.0, trainer -0.1, truncate at 2
    one = jnp.ones((1, 1), jnp.float32)
    w1 = importance_weights(-one, -0.1 * one, one, level="token", mode="truncate", cap=2.0)
    assert float(w1.weights_D_T[0, 0]) == 2.0
    grad = jax.grad(lambda lp: importance_sampling_loss(lp, -0.1 * one, one * w1.weights_D_T).loss)(
        -0.1 * one
    )
    assert float(grad[0, 0]) == pytest.approx(-2.0)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_gradients_match_the_analytic_ones_and_skip_garbage(estimator: KLEstimator):
    rng = np.random.default_rng(1)
    logprobs = jnp.asarray(rng.uniform(-3, 0, (2, 5)))
    ref = jnp.asarray(np.where(np.arange(5) < 4, rng.uniform(-3, 0, (2, 5)), np.nan))
    mask = jnp.asarray(np.arange(5)[None, :] < np.array([[4], [2]]), jnp.float32)
    count = float(mask.sum())

    def mean_kl(lp, rf):
        return kl_estimate(lp, rf, mask, estimator=estimator).mean

    grad_lp, grad_ref = jax.grad(mean_kl, argnums=(0, 1))(logprobs, ref)
    log_r = np.where(mask > 0, np.asarray(ref) - np.asarray(logprobs), 0.0)
    d_log_r = {"k1": -np.ones_like(log_r), "k2": log_r, "k3": np.expm1(log_r)}[estimator]
    want_ref = np.where(mask > 0, d_log_r / count, 0.0)
    np.testing.assert_allclose(grad_ref, want_ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad_lp, -want_ref, rtol=1e-5, atol=1e-7)
    assert np.all(np.isfinite(grad_ref))  # the NaN off the mask gets no gradient

    finite_ref = jnp.where(mask > 0, ref, 0.0)
    check_grads(
        lambda lp, rf: kl_estimate(lp, rf, mask, estimator=estimator).mean,
        (logprobs.astype(jnp.float32), finite_ref.astype(jnp.float32)),
        order=1,
        modes=("rev",),
        atol=2e-2,
        rtol=2e-2,
    )


# --- KL estimators ------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(mismatched_logprobs())
def test_kl_estimators_match_the_formulas_and_k3_is_non_negative(problem):
    sampler, trainer, mask = problem
    on = mask > 0
    log_r = np.where(on, trainer.astype(np.float64) - sampler.astype(np.float64), 0.0)
    want: dict[KLEstimator, np.ndarray] = {
        "k1": -log_r,
        "k2": 0.5 * log_r**2,
        "k3": np.expm1(log_r) - log_r,
    }
    for estimator, values in want.items():
        out = kl_estimate(sampler, trainer, mask, estimator=estimator)
        kl = np.asarray(out.kl_D_T)
        np.testing.assert_allclose(kl, np.where(on, values, 0.0), rtol=1e-4, atol=1e-5)
        mean = values[on].mean() if on.any() else 0.0
        assert float(out.mean) == pytest.approx(mean, rel=1e-4, abs=1e-5)
    k3 = np.asarray(kl_estimate(sampler, trainer, mask, estimator="k3").kl_D_T)
    assert np.all(k3 >= 0.0)


@settings(max_examples=40, deadline=None)
@given(mismatched_logprobs())
def test_k1_and_k2_means_are_the_kl_sample_train_metrics(problem):
    sampler, trainer, mask = problem
    if not mask.any():
        return
    found = kl_sample_train_metrics(
        np.nan_to_num(sampler), np.nan_to_num(trainer), mask
    )  # the metric reads the arrays it masks: garbage made finite
    k1 = kl_estimate(sampler, trainer, mask, estimator="k1").mean
    k2 = kl_estimate(sampler, trainer, mask, estimator="k2").mean
    assert float(k1) == pytest.approx(found["optim/kl_sample_train_v1"], rel=1e-5, abs=1e-6)
    assert float(k2) == pytest.approx(found["optim/kl_sample_train_v2"], rel=1e-5, abs=1e-6)


def test_the_kl_penalty_takes_the_estimate_directly_at_full_precision():
    """k3 ≈ 1e-4 at logprobs ≈ −10: handed to the shaping directly it keeps float32's
    relative precision; through a reference `ref' = q − k` (so that `q − ref' = k`) the
    spacing of float32 near 10 (~1e-6) costs ~1% of it."""
    from rlpure.kl import kl_penalty_advantages, kl_penalty_advantages_from_estimate
    from rlpure.packing import DatumBatch

    rng = np.random.default_rng(3)
    shape = (3, 8)
    q = rng.uniform(-10.5, -9.5, shape).astype(np.float32)
    ref = (q.astype(np.float64) + rng.uniform(0.01, 0.02, shape)).astype(np.float32)
    mask = (rng.uniform(size=shape) < 0.8).astype(np.float32)
    zeros = np.zeros(shape, np.float32)
    batch = DatumBatch(
        input_tokens_D_T=zeros.astype(np.int32),
        target_tokens_D_T=zeros.astype(np.int32),
        logprobs_D_T=q,
        advantages_D_T=zeros,
        mask_D_T=mask,
        length_D=np.full(shape[0], shape[1], np.int32),
        group_idx_D=np.zeros(shape[0], np.int32),
        traj_idx_D=np.arange(shape[0], dtype=np.int32),
        num_datums=shape[0],
    )
    log_r = ref.astype(np.float64) - q.astype(np.float64)
    k3 = np.where(mask > 0, np.expm1(log_r) - log_r, 0.0)  # ~1e-4, float64
    assert k3[mask > 0].min() > 2e-5 and k3.max() < 3e-4
    want = mask * (k3[mask > 0].mean() - k3)  # coef 1, no discount, float64
    estimate = kl_estimate(q, ref, mask, estimator="k3").kl_D_T
    direct, metrics = kl_penalty_advantages_from_estimate(batch, estimate, coef=1.0)
    np.testing.assert_allclose(direct.advantages_D_T, want, rtol=0, atol=5e-4 * np.abs(want).max())
    assert float(metrics["kl_policy_base"]) == pytest.approx(k3[mask > 0].mean(), rel=1e-3)
    routed, _ = kl_penalty_advantages(batch, q - np.asarray(estimate), coef=1.0)
    error = np.abs(np.asarray(routed.advantages_D_T) - want).max() / np.abs(want).max()
    assert error > 5e-3  # the route this function replaces


# --- overlong ------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 64), st.integers(0, 64), st.lists(st.integers(0, 200), min_size=1))
def test_overlong_is_zero_below_the_buffer_and_monotone(buffer, extra, lengths):
    max_length = buffer + extra
    lengths_D = np.sort(np.asarray(lengths, np.int32))
    penalty = np.asarray(overlong_penalty(lengths_D, max_length=max_length, buffer=buffer))
    assert np.all(penalty[lengths_D <= max_length - buffer] == 0.0)
    assert np.all(penalty[lengths_D > max_length] == -1.0)
    assert np.all(np.diff(penalty) <= 0.0)  # non-increasing in the length
    assert np.all((penalty >= -1.0) & (penalty <= 0.0))
    ramp = (lengths_D > max_length - buffer) & (lengths_D <= max_length)
    want = (max_length - buffer - lengths_D[ramp]) / buffer
    np.testing.assert_allclose(penalty[ramp], want, rtol=1e-6)


# --- errors and doctests -------------------------------------------------------------------------


def test_errors_name_the_argument():
    z = np.zeros((2, 3))
    with pytest.raises(
        ValueError, match=re.escape("importance_weights: mask_D_T has shape (2, 2)")
    ):
        importance_weights(z, z, np.ones((2, 2)))
    with pytest.raises(ValueError, match="importance_weights: level must be one of"):
        importance_weights(z, z, z, level="row")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="importance_weights: mode must be one of"):
        importance_weights(z, z, z, mode="clip")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"importance_weights: cap must be >= 1 .* got 0.5"):
        importance_weights(z, z, z, cap=0.5)
    with pytest.raises(ValueError, match="importance_weights: cap must be a scalar"):
        importance_weights(z, z, z, cap=np.ones(2))
    with pytest.raises(ValueError, match=re.escape("kl_estimate: ref_logprobs_D_T has shape (3,)")):
        kl_estimate(z, np.zeros(3), z)
    with pytest.raises(ValueError, match="kl_estimate: estimator must be one of 'k1', 'k2', 'k3'"):
        kl_estimate(z, z, z, estimator="k4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="overlong_penalty: buffer must be a number >= 1, got 0"):
        overlong_penalty(np.zeros(2), max_length=4, buffer=0)
    with pytest.raises(ValueError, match=r"overlong_penalty: max_length must be >= buffer \(4\)"):
        overlong_penalty(np.zeros(2), max_length=3, buffer=4)
    with pytest.raises(ValueError, match=re.escape("overlong_penalty: lengths_D must be [D]")):
        overlong_penalty(z, max_length=3, buffer=1)


def test_usable_inside_jit():
    sampler, trainer, mask = np.zeros((2, 3)), np.full((2, 3), 0.1), np.ones((2, 3))
    want = importance_weights(sampler, trainer, mask, level="geometric", mode="truncate", cap=1.05)

    @jax.jit
    def weights(s, t, m, cap):
        return importance_weights(s, t, m, level="geometric", mode="truncate", cap=cap).weights_D_T

    np.testing.assert_allclose(weights(sampler, trainer, mask, 1.05), want.weights_D_T)
    penalty = jax.jit(lambda n, L, B: overlong_penalty(n, max_length=L, buffer=B))
    assert penalty(jnp.array([9]), 10, 4).tolist() == [-0.75]


def test_doctests():
    result = doctest.testmod(corrections_module)
    assert result.failed == 0
    assert result.attempted > 0
