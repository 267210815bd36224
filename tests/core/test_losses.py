"""Tests for rlpure.losses: golden values, gradients (finite differences and analytic forms),
on-policy identities, padding invariance, a float64 loop reference, jit behaviour and errors.

float64 is enabled only inside `jax.enable_x64(True)` blocks so other test files in the same
process keep float32 defaults.
"""

from __future__ import annotations

import doctest
import functools
import inspect
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

from rlpure.losses import (
    LOSSES,
    LossOutput,
    cispo_clipped_weight_loss,
    compute_loss,
    cross_entropy_loss,
    dro_quadratic_penalty_loss,
    gspo_token_clipped_surrogate_loss,
    importance_sampling_loss,
    loss_fn_inputs_from_batch,
    ppo_clipped_surrogate_loss,
)
from rlpure.losses import _registry as losses_module
from rlpure.packing import DatumBatch

LN2 = math.log(2.0)

# Config used wherever a loss has no documented default.
REQUIRED_CONFIG = {
    "dro": {"beta": 0.3},
    "gspo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
}


def rl_inputs(lp_sampling, adv, *, seq_mask=None, weights=None):
    lp_sampling = jnp.asarray(lp_sampling)
    inputs = {
        "target_tokens": jnp.ones(lp_sampling.shape, jnp.int32),
        "logprobs": lp_sampling,
        "advantages": jnp.asarray(adv),
        "weights": jnp.ones(lp_sampling.shape) if weights is None else jnp.asarray(weights),
        "sequence_ratio_mask": jnp.ones(lp_sampling.shape)
        if seq_mask is None
        else jnp.asarray(seq_mask),
    }
    return inputs


@functools.cache
def _jitted_loss_and_grad(name, config_items, x64):
    # One compiled function per (loss, config, precision): eager op-by-op dispatch would
    # compile every primitive separately and make this file several times slower.
    del x64  # part of the cache key only: jit specialises on dtypes anyway

    def value(lp, inputs, valid):
        return compute_loss(name, lp, inputs, dict(config_items), valid_mask_D_T=valid)

    def loss_and_aux(lp, inputs, valid):
        out = value(lp, inputs, valid)
        return out.loss, out

    return jax.jit(value), jax.jit(jax.value_and_grad(loss_and_aux, has_aux=True))


def _compiled(name, config):
    cfg = {**REQUIRED_CONFIG.get(name, {}), **(config or {})}
    return _jitted_loss_and_grad(
        name, tuple(sorted(cfg.items())), jnp.asarray(0.0).dtype.itemsize == 8
    )


def loss_value(name, lp, inputs, config=None, valid=None):
    valid = jnp.ones(jnp.shape(lp), bool) if valid is None else jnp.asarray(valid)
    return _compiled(name, config)[0](lp, inputs, valid)


def loss_and_grad(name, lp, inputs, config=None, valid=None):
    """(LossOutput, gradient w.r.t. lp) from one compiled function."""
    valid = jnp.ones(jnp.shape(lp), bool) if valid is None else jnp.asarray(valid)
    (_, out), grad = _compiled(name, config)[1](lp, inputs, valid)
    return out, grad


def grad_of(name, lp, inputs, config=None, valid=None):
    return loss_and_grad(name, lp, inputs, config, valid)[1]


def direct(fn, *arrays, **kwargs):
    """Calls a loss function directly (not via the registry), jitted; returns (output, grad)."""

    def f(*args):
        return fn(*args, **kwargs)

    return jax.jit(f)(*arrays), jax.jit(jax.grad(lambda *a: f(*a).loss))(*arrays)


# --- golden values (hand-computed) -------------------------------------------------------------


def test_cross_entropy_golden():
    lp = jnp.array([[-1.0, -2.0, -0.5], [-3.0, -0.25, -4.0]])
    w = jnp.array([[0.0, 1.0, 2.0], [1.0, 0.5, 0.0]])
    out, grad = direct(cross_entropy_loss, lp, w)
    # -(0 + -2 + -1 + -3 + -0.125 + 0) = 6.125
    assert float(out.loss) == pytest.approx(6.125)
    assert float(out.metrics["loss:sum"]) == pytest.approx(6.125)
    np.testing.assert_array_equal(out.target_logprobs_D_T, lp)
    np.testing.assert_allclose(grad, -w)


def test_importance_sampling_golden():
    # ratios: exp(ln2) = 2, exp(0) = 1, exp(-ln2) = 0.5
    lp = jnp.array([[LN2 - 1.0, -1.0, -1.0 - LN2]])
    q = jnp.full((1, 3), -1.0)
    adv = jnp.array([[1.0, -2.0, 4.0]])
    out, _ = direct(importance_sampling_loss, lp, q, adv)
    # -(2*1 + 1*-2 + 0.5*4) = -2
    assert float(out.loss) == pytest.approx(-2.0, rel=1e-6)
    assert float(out.metrics["ratio:mean"]) == pytest.approx((2 + 1 + 0.5) / 3, rel=1e-6)
    assert float(out.metrics["ratio:min"]) == pytest.approx(0.5, rel=1e-6)
    assert float(out.metrics["ratio:max"]) == pytest.approx(2.0, rel=1e-6)
    assert float(out.metrics["action_tokens:sum"]) == 3.0


def test_ppo_golden():
    # ratios 2, 1, 0.5, 1.1 ; advantages +1, -2, +4, -1 ; bounds 0.8 / 1.2
    lp = jnp.array([[LN2, 0.0, -LN2, math.log(1.1)]])
    q = jnp.zeros((1, 4))
    adv = jnp.array([[1.0, -2.0, 4.0, -1.0]])
    out, grad = direct(ppo_clipped_surrogate_loss, lp, q, adv)
    # token0: min(2, 1.2) = 1.2 ; token1: min(-2, -2) = -2 ; token2: min(2, 3.2) = 2 ;
    # token3: min(-1.1, -1.1) = -1.1  → objective 0.1, loss -0.1
    assert float(out.loss) == pytest.approx(-0.1, abs=1e-5)
    # clipped: ratios 2 and 0.5 lie outside [0.8, 1.2] → 2 of 4
    assert float(out.metrics["clip_fraction:mean"]) == pytest.approx(0.5)
    # token0 clipped branch binds → 0 ; token1 → -r*A = 2 ; token2 unclipped → -0.5*4 = -2 ;
    # token3 inside → -1.1 * -1 = 1.1
    np.testing.assert_allclose(grad, [[0.0, 2.0, -2.0, 1.1]], rtol=1e-5, atol=1e-6)


def test_cispo_golden_with_tinker_defaults():
    # ratios 8 (clipped to 4), 1, 0.1 (lower bound 0 does not bind)
    lp = jnp.array([[math.log(8.0) - 1.0, -1.0, math.log(0.1) - 1.0]])
    q = jnp.full((1, 3), -1.0)
    adv = jnp.array([[1.0, 2.0, -1.0]])
    out, grad = loss_and_grad("cispo", lp, rl_inputs(q, adv))
    direct_out, _ = direct(cispo_clipped_weight_loss, lp, q, adv)
    assert float(direct_out.loss) == float(out.loss)
    expected = -(4.0 * float(lp[0, 0]) * 1.0 + 1.0 * -1.0 * 2.0 + 0.1 * float(lp[0, 2]) * -1.0)
    assert float(out.loss) == pytest.approx(expected, rel=1e-5)
    assert float(out.metrics["clip_fraction:mean"]) == pytest.approx(1 / 3)
    np.testing.assert_allclose(grad, [[-4.0, -2.0, 0.1]], rtol=1e-5)


def test_dro_golden():
    lp = jnp.array([[-1.0, -2.0]])
    q = jnp.array([[-3.0, -2.5]])
    adv = jnp.array([[1.0, -1.0]])
    out, grad = direct(dro_quadratic_penalty_loss, lp, q, adv, beta=0.5)
    # objective: (-1*1 - 0.25*4) + (-2*-1 - 0.25*0.25) = -2 + 1.9375 = -0.0625
    assert float(out.loss) == pytest.approx(0.0625)
    # -A + beta*(lp - q)
    np.testing.assert_allclose(grad, [[-1.0 + 1.0, 1.0 + 0.25]], rtol=1e-6)


def test_gspo_golden():
    # datum 0: log-ratios ln2, 0 over the mask → s = sqrt(2) (> 1.2: clipped)
    # datum 1: log-ratios ln(1.1), [excluded by the mask] → s = 1.1 (inside)
    lp = jnp.array([[LN2, 0.0], [math.log(1.1), -5.0]])
    q = jnp.array([[0.0, 0.0], [0.0, -1.0]])
    adv = jnp.array([[1.0, -1.0], [2.0, 3.0]])
    seq_mask = jnp.array([[1.0, 1.0], [1.0, 0.0]])
    kwargs = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    out, grad = direct(gspo_token_clipped_surrogate_loss, lp, q, adv, seq_mask, **kwargs)
    s0 = math.sqrt(2.0)
    # datum 0: A=+1 → min(s0, 1.2) = 1.2 ; A=-1 → min(-s0, -1.2) = -s0
    # datum 1: 1.1*2 + 1.1*3 = 5.5
    expected = -((1.2 - s0) + 5.5)
    assert float(out.loss) == pytest.approx(expected, rel=1e-5)
    assert float(out.metrics["clip_fraction:mean"]) == pytest.approx(0.5)
    assert float(out.metrics["ratio:max"]) == pytest.approx(s0, rel=1e-5)
    # clipped branch binds on (0,0) → 0 ; (0,1) unclipped → -s0*-1 ; datum 1 → -1.1*A
    np.testing.assert_allclose(grad, [[0.0, s0], [-2.2, -3.3]], rtol=1e-5)


def test_gspo_empty_sequence_mask_gives_unit_ratio():
    lp = jnp.array([[-0.3, -0.2]])
    inputs = rl_inputs(jnp.zeros((1, 2)), [[1.0, 1.0]], seq_mask=jnp.zeros((1, 2)))
    out, grad = loss_and_grad("gspo", lp, inputs)
    assert float(out.loss) == pytest.approx(-2.0)
    np.testing.assert_allclose(grad, [[-1.0, -1.0]])


def test_no_action_positions_metrics_are_neutral():
    out, _ = direct(
        ppo_clipped_surrogate_loss, jnp.zeros((2, 3)), jnp.ones((2, 3)), jnp.zeros((2, 3))
    )
    assert float(out.loss) == 0.0
    assert float(out.metrics["ratio:mean"]) == 1.0
    assert float(out.metrics["ratio:min"]) == 1.0
    assert float(out.metrics["ratio:max"]) == 1.0
    assert float(out.metrics["clip_fraction:mean"]) == 0.0
    assert float(out.metrics["action_tokens:sum"]) == 0.0


# --- gradients -------------------------------------------------------------------------------


def _smooth_point(seed, shape=(2, 4)):
    """Logprobs whose ratios sit strictly inside (0.85, 1.15): away from PPO's kinks."""
    rng = np.random.default_rng(seed)
    q = rng.uniform(-3.0, -0.5, shape)
    lp = q + rng.uniform(-0.15, 0.13, shape)
    adv = rng.normal(size=shape)
    return lp, q, adv


@pytest.mark.parametrize("name", ["cross_entropy", "importance_sampling", "ppo", "dro"])
def test_check_grads_against_finite_differences(name):
    with jax.enable_x64(True):
        lp, q, adv = _smooth_point(0)
        inputs = rl_inputs(jnp.asarray(q), jnp.asarray(adv), weights=jnp.asarray(adv))
        check_grads(
            lambda x: loss_value(name, x, inputs).loss,
            (jnp.asarray(lp),),
            order=1,
            modes=("fwd", "rev"),
            atol=1e-6,
            rtol=1e-6,
        )


def test_check_grads_ppo_outside_the_clip_region():
    with jax.enable_x64(True):
        q = jnp.zeros((1, 4))
        # ratios 2 (A>0: clipped, flat) , 0.5 (A>0: unclipped), 2 (A<0: unclipped), 0.5 (A<0: flat)
        lp = jnp.array([[LN2, -LN2, LN2, -LN2]])
        adv = jnp.array([[1.0, 1.0, -1.0, -1.0]])
        inputs = rl_inputs(q, adv)
        check_grads(lambda x: loss_value("ppo", x, inputs).loss, (lp,), order=1, atol=1e-6)
        np.testing.assert_allclose(grad_of("ppo", lp, inputs), [[0.0, -0.5, 2.0, 0.0]])


def test_check_grads_cispo_where_the_clip_binds():
    # Where every ratio is clipped the stop-gradient'ed weight is locally constant, so the
    # derivative of the loss value equals CISPO's gradient and finite differences apply.
    with jax.enable_x64(True):
        q = jnp.array([[-2.0, -1.0, -3.0]])
        lp = q + jnp.array([[2.0, 1.8, 2.5]])  # ratios ~7.4, 6.0, 12.2 > 4
        adv = jnp.array([[1.0, -0.5, 2.0]])
        inputs = rl_inputs(q, adv)
        check_grads(lambda x: loss_value("cispo", x, inputs).loss, (lp,), order=1, atol=1e-6)


def test_check_grads_gspo_single_token_sequences():
    # With one token per sequence ratio s = r, so GSPO-token's gradient is the derivative of
    # its value and finite differences apply.
    with jax.enable_x64(True):
        lp, q, adv = _smooth_point(1, shape=(3, 1))
        inputs = rl_inputs(jnp.asarray(q), jnp.asarray(adv))
        check_grads(
            lambda x: loss_value("gspo", x, inputs).loss, (jnp.asarray(lp),), order=1, atol=1e-6
        )


def test_importance_sampling_gradient_is_minus_ratio_times_advantage():
    lp, q, adv = _smooth_point(2)
    grad = grad_of("importance_sampling", jnp.asarray(lp), rl_inputs(q, adv))
    np.testing.assert_allclose(grad, -np.exp(lp - q) * adv, rtol=1e-5, atol=1e-6)


def test_cispo_passes_no_gradient_through_the_ratio():
    rng = np.random.default_rng(3)
    q = rng.uniform(-3.0, -0.5, (3, 5))
    lp = q + rng.uniform(-2.0, 2.0, (3, 5))
    adv = rng.normal(size=(3, 5))
    config = {"clip_low_threshold": 0.5, "clip_high_threshold": 2.0}
    grad = grad_of("cispo", jnp.asarray(lp), rl_inputs(q, adv), config)
    expected = -np.clip(np.exp(lp - q), 0.5, 2.0) * adv
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-6)


def test_gspo_gradient_analytic_form():
    rng = np.random.default_rng(4)
    q = rng.uniform(-3.0, -0.5, (4, 6))
    lp = q + rng.uniform(-0.4, 0.4, (4, 6))
    adv = rng.normal(size=(4, 6))
    seq_mask = (rng.uniform(size=(4, 6)) < 0.7).astype(np.float32)
    seq_mask[:, 0] = 1.0
    lo, hi = 0.9, 1.1
    config = {"clip_low_threshold": lo, "clip_high_threshold": hi}
    grad = grad_of("gspo", jnp.asarray(lp), rl_inputs(q, adv, seq_mask=seq_mask), config)
    s_D = np.exp(((lp - q) * seq_mask).sum(1) / seq_mask.sum(1))[:, None] * np.ones((1, 6))
    binds = ((adv > 0) & (s_D > hi)) | ((adv < 0) & (s_D < lo))
    expected = np.where(binds, 0.0, -s_D * adv)
    np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["importance_sampling", "ppo"])
def test_on_policy_gradient_equals_reinforce(name):
    rng = np.random.default_rng(5)
    lp = jnp.asarray(rng.uniform(-4.0, -0.1, (3, 5)), jnp.float32)
    adv = rng.normal(size=(3, 5)).astype(np.float32)
    grad = grad_of(name, lp, rl_inputs(lp, adv))
    reinforce = jax.grad(lambda x: -jnp.sum(adv * x))(lp)
    np.testing.assert_allclose(grad, reinforce, rtol=1e-6, atol=1e-7)
    # ... and so does CISPO (weight clip(1) = 1) and GSPO (s = 1) on-policy.
    for other in ("cispo", "gspo"):
        np.testing.assert_allclose(
            grad_of(other, lp, rl_inputs(lp, adv)), reinforce, rtol=1e-6, atol=1e-7
        )


# --- padding -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("garbage", [np.nan, np.inf, 1e30])
def test_padding_changes_nothing(name, garbage):
    rng = np.random.default_rng(6)
    D, T = 3, 5
    lengths = np.array([5, 2, 0])
    valid = np.arange(T)[None, :] < lengths[:, None]
    q = rng.uniform(-3.0, -0.5, (D, T))
    lp = q + rng.uniform(-0.5, 0.5, (D, T))
    adv = rng.normal(size=(D, T))
    weights = rng.uniform(size=(D, T))
    seq_mask = np.ones((D, T))

    def fill(x):
        return jnp.asarray(np.where(valid, x, garbage), jnp.float32)

    clean = rl_inputs(
        np.where(valid, q, 0),
        np.where(valid, adv, 0),
        weights=np.where(valid, weights, 0),
        seq_mask=np.where(valid, seq_mask, 0),
    )
    dirty = rl_inputs(fill(q), fill(adv), weights=fill(weights), seq_mask=fill(seq_mask))
    lp_clean = jnp.asarray(np.where(valid, lp, 0), jnp.float32)
    lp_dirty = fill(lp)
    out_clean, g_clean = loss_and_grad(name, lp_clean, clean, valid=valid)
    out_dirty, g_dirty = loss_and_grad(name, lp_dirty, dirty, valid=valid)
    assert float(out_dirty.loss) == float(out_clean.loss)
    for key in out_clean.metrics:
        assert float(out_dirty.metrics[key]) == float(out_clean.metrics[key]), key
    np.testing.assert_array_equal(g_dirty, g_clean)
    assert np.all(np.asarray(g_dirty)[~valid] == 0.0)
    # ... and equals the loss on the unpadded rows alone (the masked == sliced identity).
    row = 0
    sliced = {k: v[row : row + 1] for k, v in clean.items()}
    out_row0 = loss_value(name, lp_clean[row : row + 1], sliced)
    row1 = {k: v[1:2, :2] for k, v in clean.items()}
    out_row1 = loss_value(name, lp_clean[1:2, :2], row1)
    assert float(out_clean.loss) == pytest.approx(
        float(out_row0.loss) + float(out_row1.loss), rel=1e-5, abs=1e-5
    )


# --- float64 loop reference (differential, property-based) --------------------------------------


def reference_loss_and_grad(name, lp, q, adv, w, seq_mask, valid, cfg):
    """Slow, obviously-correct float64 reference: value and analytic gradient, Python loops."""
    D, T = lp.shape
    loss = 0.0
    grad = np.zeros((D, T))
    lo = cfg.get("clip_low_threshold", 0.0)
    hi = cfg.get("clip_high_threshold", 0.0)
    for d in range(D):
        s = 1.0
        if name == "gspo":
            members = [t for t in range(T) if valid[d, t] and seq_mask[d, t] != 0]
            mean = sum(lp[d, t] - q[d, t] for t in members) / len(members) if members else 0.0
            s = math.exp(mean)
        for t in range(T):
            if not valid[d, t]:
                continue
            x, a = lp[d, t], adv[d, t]
            r = math.exp(x - q[d, t])
            if name == "cross_entropy":
                loss -= w[d, t] * x
                grad[d, t] = -w[d, t]
            elif name == "importance_sampling":
                loss -= r * a
                grad[d, t] = -r * a
            elif name in ("ppo", "gspo"):
                ratio = r if name == "ppo" else s
                c = min(max(ratio, lo), hi)
                loss -= min(ratio * a, c * a)
                binds = (a > 0 and ratio > hi) or (a < 0 and ratio < lo)
                grad[d, t] = 0.0 if binds else -ratio * a
            elif name == "cispo":
                c = min(max(r, lo), hi)
                loss -= c * x * a
                grad[d, t] = -c * a
            elif name == "dro":
                beta = cfg["beta"]
                loss -= x * a - 0.5 * beta * (x - q[d, t]) ** 2
                grad[d, t] = -a + beta * (x - q[d, t])
    return loss, grad


PAD_D, PAD_T = 4, 6  # every drawn problem is padded to this shape: one compile per config


@st.composite
def loss_problems(draw):
    name = draw(st.sampled_from(sorted(LOSSES)))
    D = draw(st.integers(1, PAD_D))
    T = draw(st.integers(1, PAD_T))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q = rng.uniform(-4.0, 0.0, (D, T))
    lp = q + rng.normal(scale=draw(st.sampled_from([0.0, 0.1, 0.5, 1.5])), size=(D, T))
    adv = rng.normal(size=(D, T)) * (rng.uniform(size=(D, T)) < 0.8)
    w = rng.uniform(size=(D, T))
    seq_mask = (rng.uniform(size=(D, T)) < 0.7).astype(float)
    lengths = rng.integers(0, T + 1, D)
    valid = np.arange(T)[None, :] < lengths[:, None]
    cfg = dict(REQUIRED_CONFIG.get(name, {}))
    if name in ("ppo", "cispo", "gspo") and draw(st.booleans()):
        lo = draw(st.sampled_from([0.0, 0.9]))
        cfg.update(clip_low_threshold=lo, clip_high_threshold=lo + 0.2)
    return name, lp, q, adv, w, seq_mask, valid, cfg


def _pad(x, fill):
    out = np.full((PAD_D, PAD_T), fill, dtype=np.asarray(x).dtype)
    out[: x.shape[0], : x.shape[1]] = x
    return out


@settings(max_examples=60, deadline=None)
@given(loss_problems())
def test_matches_float64_loop_reference(problem):
    name, lp, q, adv, w, seq_mask, valid, cfg = problem
    spec = LOSSES[name]
    merged = {**spec.config_defaults, **cfg}
    lo, hi = merged.get("clip_low_threshold", 0.0), merged.get("clip_high_threshold", 0.0)
    if (
        "clip_low_threshold" in merged
    ):  # stay away from the clip kinks, where the branch is a coin flip
        ratios = np.exp(lp - q)
        assume(np.all((np.abs(ratios - lo) > 1e-6) & (np.abs(ratios - hi) > 1e-6)))
    if name == "gspo":  # GSPO's sequence ratio must also stay off the kinks
        for d in range(lp.shape[0]):
            members = valid[d] & (seq_mask[d] != 0)
            s = math.exp((lp[d] - q[d])[members].mean()) if members.any() else 1.0
            assume(abs(s - lo) > 1e-6 and abs(s - hi) > 1e-6)
    want_loss, want_grad = reference_loss_and_grad(name, lp, q, adv, w, seq_mask, valid, merged)
    with jax.enable_x64(True):
        garbage = np.nan  # padding (rows/columns beyond the drawn shape, or beyond lengths)
        valid_pad = _pad(valid, False)

        def padded(x):
            return jnp.asarray(np.where(valid_pad, _pad(x, garbage), garbage))

        inputs = {
            "target_tokens": jnp.zeros((PAD_D, PAD_T), jnp.int32),
            "logprobs": padded(q),
            "advantages": padded(adv),
            "weights": padded(w),
            "sequence_ratio_mask": padded(seq_mask),
        }
        lp_pad = padded(lp)
        out, grad_pad = loss_and_grad(name, lp_pad, inputs, cfg, valid_pad)
        grad = np.asarray(grad_pad)
    assert float(out.loss) == pytest.approx(want_loss, rel=1e-9, abs=1e-9)
    np.testing.assert_allclose(grad[: lp.shape[0], : lp.shape[1]], want_grad, rtol=1e-9, atol=1e-9)
    assert np.all(grad[~valid_pad] == 0.0)


# --- jit, pytree, registry -----------------------------------------------------------------------


def test_jit_value_and_grad_with_aux_and_no_recompile():
    traces = []

    def step(lp, inputs):
        traces.append(1)
        out = compute_loss("ppo", lp, inputs, {"clip_low_threshold": 0.9})
        return out.loss, out

    fn = jax.jit(jax.value_and_grad(step, has_aux=True))
    rng = np.random.default_rng(7)
    for _ in range(3):
        lp = jnp.asarray(rng.uniform(-2, -0.1, (4, 8)), jnp.float32)
        inputs = rl_inputs(lp + 0.05, rng.normal(size=(4, 8)).astype(np.float32))
        (loss, aux), grad = fn(lp, inputs)
        assert isinstance(aux, LossOutput)
        assert float(aux.metrics["loss:sum"]) == pytest.approx(float(loss))
        np.testing.assert_array_equal(aux.target_logprobs_D_T, lp)
        assert grad.shape == lp.shape
    assert len(traces) == 1


def test_loss_output_is_a_pytree():
    out = importance_sampling_loss(jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.ones((1, 2)))
    leaves = jax.tree_util.tree_leaves(out)
    assert len(leaves) == 2 + len(out.metrics)
    doubled = jax.tree_util.tree_map(lambda x: 2 * x, out)
    assert isinstance(doubled, LossOutput)
    assert float(doubled.loss) == 2 * float(out.loss)


def test_registry_is_consistent():
    assert set(LOSSES) == {"cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo"}
    for name, spec in LOSSES.items():
        assert spec.name == name
        params = inspect.signature(spec.loss_fn).parameters
        for key in spec.config_keys:
            assert params[key].kind is inspect.Parameter.KEYWORD_ONLY, (name, key)
        for key, value in spec.config_defaults.items():
            assert params[key].default == value, (name, key)
        for key in spec.required_config:
            assert params[key].default is inspect.Parameter.empty, (name, key)
        assert "target_tokens" in spec.required_inputs
        assert set(spec.array_inputs) <= set(spec.required_inputs)
    assert LOSSES["ppo"].config_defaults == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    assert LOSSES["cispo"].config_defaults == {
        "clip_low_threshold": 0.0,
        "clip_high_threshold": 4.0,
    }


def test_config_overrides_defaults():
    lp = jnp.array([[LN2]])
    inputs = rl_inputs(jnp.zeros((1, 1)), [[1.0]])
    assert float(compute_loss("ppo", lp, inputs).loss) == pytest.approx(-1.2)
    tight = compute_loss("ppo", lp, inputs, {"clip_high_threshold": 1.1})
    assert float(tight.loss) == pytest.approx(-1.1)


# --- errors --------------------------------------------------------------------------------------


def test_unknown_loss_name():
    with pytest.raises(ValueError, match="unknown loss 'grpo'"):
        compute_loss("grpo", jnp.zeros((1, 1)), {})


def test_missing_input_names_loss_and_input():
    inputs = rl_inputs(jnp.zeros((1, 2)), jnp.ones((1, 2)))
    del inputs["advantages"]
    with pytest.raises(ValueError, match=r"ppo: missing loss_fn_inputs \['advantages'\]"):
        compute_loss("ppo", jnp.zeros((1, 2)), inputs)
    with pytest.raises(ValueError, match="gspo: missing loss_fn_inputs"):
        compute_loss(
            "gspo",
            jnp.zeros((1, 2)),
            {
                k: v
                for k, v in rl_inputs(jnp.zeros((1, 2)), jnp.ones((1, 2))).items()
                if k != "sequence_ratio_mask"
            },
            REQUIRED_CONFIG["gspo"],
        )


def test_wrong_shape_names_loss_input_and_both_shapes():
    inputs = rl_inputs(jnp.zeros((2, 3)), jnp.ones((2, 3)))
    inputs["logprobs"] = jnp.zeros((2, 4))
    with pytest.raises(
        ValueError,
        match=r"cispo: input 'logprobs' has shape \(2, 4\), "
        r"expected \(2, 3\)",
    ):
        compute_loss("cispo", jnp.zeros((2, 3)), inputs)
    with pytest.raises(ValueError, match=r"valid_mask_D_T has shape \(3,\), expected \(2, 3\)"):
        compute_loss(
            "ppo",
            jnp.zeros((2, 3)),
            rl_inputs(jnp.zeros((2, 3)), jnp.ones((2, 3))),
            valid_mask_D_T=jnp.ones(3),
        )
    with pytest.raises(ValueError, match=r"must be \[D, T\], got shape \(3,\)"):
        compute_loss("ppo", jnp.zeros(3), {})
    with pytest.raises(ValueError, match=r"importance_sampling: input 'advantages' has shape"):
        importance_sampling_loss(jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.zeros((2, 1)))


def test_unknown_input_and_config_keys():
    inputs = rl_inputs(jnp.zeros((1, 1)), jnp.ones((1, 1)))
    with pytest.raises(ValueError, match=r"ppo: unknown loss_fn_inputs \['mask'\]"):
        compute_loss("ppo", jnp.zeros((1, 1)), {**inputs, "mask": jnp.ones((1, 1))})
    with pytest.raises(ValueError, match=r"ppo: unknown config keys \['clip_epsilon'\]"):
        compute_loss("ppo", jnp.zeros((1, 1)), inputs, {"clip_epsilon": 0.2})
    with pytest.raises(ValueError, match=r"importance_sampling: unknown config keys \['beta'\]"):
        compute_loss("importance_sampling", jnp.zeros((1, 1)), inputs, {"beta": 0.1})


def test_required_config_and_bad_values():
    inputs = rl_inputs(jnp.zeros((1, 1)), jnp.ones((1, 1)))
    with pytest.raises(ValueError, match=r"dro: config \['beta'\] must be given"):
        compute_loss("dro", jnp.zeros((1, 1)), inputs)
    with pytest.raises(ValueError, match="gspo: config"):
        compute_loss("gspo", jnp.zeros((1, 1)), inputs, {"clip_low_threshold": 0.8})
    with pytest.raises(ValueError, match="clip_low_threshold <= clip_high_threshold"):
        compute_loss("ppo", jnp.zeros((1, 1)), inputs, {"clip_low_threshold": 1.5})
    with pytest.raises(ValueError, match="'beta' must be finite"):
        compute_loss("dro", jnp.zeros((1, 1)), inputs, {"beta": math.inf})
    with pytest.raises(TypeError, match="must be floating"):
        compute_loss("ppo", jnp.zeros((1, 1), jnp.int32), inputs)


def test_loss_fn_inputs_from_batch_under_jit():
    lengths = np.array([4, 2, 0], np.int32)
    real = np.arange(4)[None, :] < lengths[:, None]
    mask = (real & (np.arange(4)[None, :] >= 1)).astype(np.float32)
    rng = np.random.default_rng(8)
    q = np.where(mask > 0, rng.uniform(-2, -0.1, (3, 4)), 0.0).astype(np.float32)
    batch = DatumBatch(
        input_tokens_D_T=np.where(real, 5, 0).astype(np.int32),
        target_tokens_D_T=np.where(real, 6, 0).astype(np.int32),
        logprobs_D_T=q,
        advantages_D_T=np.where(mask > 0, 1.5, 0.0).astype(np.float32),
        mask_D_T=mask,
        length_D=lengths,
        group_idx_D=np.array([0, 0, -1], np.int32),
        traj_idx_D=np.array([0, 1, -1], np.int32),
        num_datums=2,
    )

    @jax.jit
    def loss_and_grad(lp, b):
        inputs, valid = loss_fn_inputs_from_batch(b)
        return jax.value_and_grad(
            lambda x: compute_loss("importance_sampling", x, inputs, valid_mask_D_T=valid).loss
        )(lp)

    lp = jnp.asarray(q + 0.1 * mask)
    loss, grad = loss_and_grad(lp, batch)
    want = -np.sum(np.exp(0.1 * mask) * 1.5 * mask)
    assert float(loss) == pytest.approx(want, rel=1e-6)
    np.testing.assert_allclose(grad, -np.exp(0.1 * mask) * 1.5 * mask, rtol=1e-6)
    inputs, valid = loss_fn_inputs_from_batch(batch)
    np.testing.assert_array_equal(valid, real)
    np.testing.assert_array_equal(inputs["weights"], mask)


def test_doctests():
    result = doctest.testmod(losses_module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0


def test_policy_loss_names_are_the_registered_losses_but_cross_entropy() -> None:
    from typing import get_args

    from rlpure.losses import PolicyLossName

    assert set(get_args(PolicyLossName)) == set(LOSSES) - {"cross_entropy"}


# --- shape checks: every loss refuses a mis-shaped mask, naming it -----------------------------


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("mask_shape", [(1, 3), (2, 1)])
def test_every_loss_refuses_a_mis_shaped_valid_mask(name, mask_shape):
    """Called directly (not via `compute_loss`) and under `jit`: a `[1, T]` or `[D, 1]` mask
    would broadcast in `jnp.where` without the check."""
    spec = LOSSES[name]
    lp = jnp.zeros((2, 3))
    inputs = rl_inputs(lp, jnp.ones((2, 3)))
    arrays = [inputs[key] for key in spec.array_inputs]
    want = (
        f"{name}: valid_mask_D_T has shape {mask_shape}, expected (2, 3) "
        "(the shape of target_logprobs_D_T)"
    )
    bad = jnp.ones(mask_shape, bool)
    config = REQUIRED_CONFIG.get(name, {})
    with pytest.raises(ValueError, match=re.escape(want)):
        spec.loss_fn(lp, *arrays, valid_mask_D_T=bad, **config)
    with pytest.raises(ValueError, match=re.escape(want)):
        jax.jit(lambda x: spec.loss_fn(x, *arrays, valid_mask_D_T=bad, **config).loss)(lp)
    with pytest.raises(ValueError, match=re.escape(want)):
        compute_loss(name, lp, inputs, config, valid_mask_D_T=bad)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_every_loss_input_is_shape_checked_by_name(name):
    spec = LOSSES[name]
    lp = jnp.zeros((2, 3))
    inputs = rl_inputs(lp, jnp.ones((2, 3)))
    config = REQUIRED_CONFIG.get(name, {})
    for i, key in enumerate(spec.array_inputs):
        arrays = [inputs[k] for k in spec.array_inputs]
        arrays[i] = jnp.ones((1, 3))
        want = (
            f"{name}: input {key!r} has shape (1, 3), expected (2, 3) "
            "(the shape of target_logprobs_D_T)"
        )
        with pytest.raises(ValueError, match=re.escape(want)):
            spec.loss_fn(lp, *arrays, **config)


# --- cross_entropy with K targets a position (top-K distillation) ------------------------------


def _top_k_problem(seed, shape=(3, 5, 4)):
    rng = np.random.default_rng(seed)
    lp = jnp.asarray(-rng.exponential(2.0, size=shape), jnp.float32)
    w = jnp.asarray(rng.dirichlet(np.ones(shape[-1]), size=shape[:2]), jnp.float32)
    valid = jnp.asarray(np.arange(shape[1])[None, :] < rng.integers(1, shape[1] + 1, (shape[0], 1)))
    return lp, w, valid


@pytest.mark.parametrize("seed", range(3))
def test_top_k_cross_entropy_is_the_sum_of_its_one_target_losses(seed):
    lp, w, valid = _top_k_problem(seed)
    inputs = {"target_tokens": jnp.zeros(lp.shape, jnp.int32), "weights": w}
    out = compute_loss("cross_entropy", lp, inputs, valid_mask_D_T=valid)
    columns = [
        compute_loss(
            "cross_entropy",
            lp[..., k],
            {"target_tokens": jnp.zeros(lp.shape[:2], jnp.int32), "weights": w[..., k]},
            valid_mask_D_T=valid,
        )
        for k in range(lp.shape[-1])
    ]
    assert float(out.loss) == pytest.approx(sum(float(c.loss) for c in columns), rel=1e-6)
    np.testing.assert_array_equal(out.target_logprobs_D_T, lp)
    grad = jax.grad(lambda x: compute_loss("cross_entropy", x, inputs, valid_mask_D_T=valid).loss)
    np.testing.assert_array_equal(grad(lp), -jnp.where(valid[..., None], w, 0))


def test_top_k_padding_changes_nothing_even_nan():
    lp, w, valid = _top_k_problem(5)
    garbage = jnp.where(valid[..., None], lp, jnp.nan)
    clean, dirty = (direct(cross_entropy_loss, x, w, valid_mask_D_T=valid) for x in (lp, garbage))
    assert float(dirty[0].loss) == float(clean[0].loss)
    np.testing.assert_array_equal(dirty[1], clean[1])


def test_top_k_inputs_are_cross_entropy_s_alone_and_shape_checked():
    lp, w, _ = _top_k_problem(6)
    with pytest.raises(
        ValueError,
        match=re.escape("cross_entropy: input 'weights' has shape (3, 5), expected (3, 5, 4)"),
    ):
        compute_loss(
            "cross_entropy", lp, {"target_tokens": jnp.zeros(lp.shape), "weights": w[..., 0]}
        )
    with pytest.raises(
        ValueError, match=re.escape("valid_mask_D_T has shape (3, 5, 4), expected (3, 5)")
    ):
        cross_entropy_loss(lp, w, valid_mask_D_T=jnp.ones(lp.shape))
    inputs = {**rl_inputs(lp[..., 0], jnp.ones(lp.shape[:2])), "target_tokens": jnp.zeros(lp.shape)}
    with pytest.raises(
        ValueError, match=re.escape("ppo: target_logprobs_D_T must be [D, T], got shape (3, 5, 4)")
    ):
        compute_loss("ppo", lp, inputs)
    assert [name for name, spec in LOSSES.items() if spec.top_k_inputs] == ["cross_entropy"]
