"""Tests for rlpure.kl: golden values, identities, a float64 loop reference, padding, errors."""

from __future__ import annotations

import doctest
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

import rlpure.kl as kl_module
from rlpure.kl import discounted_future_sum, kl_penalty_advantages
from rlpure.packing import DatumBatch, check_datum_batch
from tests.compile_count import count_compiles


def make_batch(logprobs, mask, advantages, lengths, num_datums=None) -> DatumBatch:
    logprobs = np.asarray(logprobs, np.float32)
    D, T = logprobs.shape
    lengths = np.asarray(lengths, np.int32)
    num = int(np.sum(lengths > 0)) if num_datums is None else num_datums
    idx = np.where(np.arange(D) < num, np.arange(D), -1).astype(np.int32)
    tokens = np.where(np.arange(T)[None, :] < lengths[:, None], 7, 0).astype(np.int32)
    batch = DatumBatch(
        input_tokens_D_T=tokens,
        target_tokens_D_T=tokens,
        logprobs_D_T=logprobs,
        advantages_D_T=np.asarray(advantages, np.float32),
        mask_D_T=np.asarray(mask, np.float32),
        length_D=lengths,
        group_idx_D=idx,
        traj_idx_D=np.where(idx >= 0, 0, -1).astype(np.int32),
        num_datums=num,
    )
    check_datum_batch(batch)
    return batch


# --- golden ------------------------------------------------------------------------------------


def golden_batch():
    # datum 0: [obs, act, act, obs, act]   datum 1: [obs, act, pad, pad, pad]   row 2: padding
    mask = [[0, 1, 1, 0, 1], [0, 1, 0, 0, 0], [0, 0, 0, 0, 0]]
    q = [[0.0, -1.0, -2.0, 0.0, -0.5], [0.0, -3.0, 0.0, 0.0, 0.0], [0.0] * 5]
    adv = [[0.0, 1.0, 1.0, 0.0, 1.0], [0.0, -1.0, 0.0, 0.0, 0.0], [0.0] * 5]
    # d on action tokens: 1.0, 0.0, 0.5 | -1.0 → avg = 0.5 / 4 = 0.125
    ref = [[9.0, -2.0, -2.0, 9.0, -1.0], [9.0, -2.0, np.nan, np.nan, np.nan], [np.nan] * 5]
    return make_batch(q, mask, adv, [5, 2, 0]), np.asarray(ref, np.float32)


def test_golden_without_discount():
    batch, ref = golden_batch()
    shaped, metrics = kl_penalty_advantages(batch, ref, coef=2.0)
    assert float(metrics["kl_policy_base"]) == pytest.approx(0.125)
    # added = 2 * mask * (0.125 - d)
    expected = np.array(
        [
            [0.0, 1.0 + 2 * (0.125 - 1.0), 1.0 + 2 * 0.125, 0.0, 1.0 + 2 * (0.125 - 0.5)],
            [0.0, -1.0 + 2 * (0.125 + 1.0), 0.0, 0.0, 0.0],
            [0.0] * 5,
        ]
    )
    np.testing.assert_allclose(shaped.advantages_D_T, expected, rtol=1e-6)


def test_golden_with_discount_masks_before_discounting():
    batch, ref = golden_batch()
    shaped, _ = kl_penalty_advantages(batch, ref, coef=2.0, discount=0.5)
    # masked term x (as in the undiscounted test): datum 0 [0, -1.75, 0.25, 0, -0.75],
    # datum 1 [0, 2.25, 0, 0, 0]; then right-to-left running = x_t + 0.5 * running.
    d0_4 = -0.75
    d0_3 = 0.0 + 0.5 * d0_4  # an observation position inherits the future KL (cookbook order)
    d0_2 = 0.25 + 0.5 * d0_3
    d0_1 = -1.75 + 0.5 * d0_2
    d0_0 = 0.0 + 0.5 * d0_1
    added = np.array([[d0_0, d0_1, d0_2, d0_3, d0_4], [0.5 * 2.25, 2.25, 0.0, 0.0, 0.0], [0.0] * 5])
    expected = np.asarray(batch.advantages_D_T) + added
    np.testing.assert_allclose(shaped.advantages_D_T, expected, rtol=1e-6)
    assert float(shaped.advantages_D_T[0, 3]) != 0.0  # observation token now carries advantage


def test_discounted_future_sum_golden():
    out = discounted_future_sum(jnp.array([[1.0, 2.0, 4.0], [0.0, 0.0, 8.0]]), 0.5)
    np.testing.assert_allclose(out, [[3.0, 4.0, 4.0], [2.0, 4.0, 8.0]])
    np.testing.assert_array_equal(discounted_future_sum(jnp.ones((2, 3)), 0.0), jnp.ones((2, 3)))
    np.testing.assert_allclose(discounted_future_sum(jnp.ones((1, 3)), 1.0), [[3.0, 2.0, 1.0]])


def test_returns_new_batch_and_never_mutates():
    batch, ref = golden_batch()
    before = {f: np.array(getattr(batch, f)) for f in batch.__struct_fields__ if f != "num_datums"}
    shaped, _ = kl_penalty_advantages(batch, ref, coef=1.0, discount=0.9)
    assert shaped is not batch
    for field, value in before.items():
        np.testing.assert_array_equal(getattr(batch, field), value)
    for field in before:
        if field != "advantages_D_T":
            assert getattr(shaped, field) is getattr(batch, field)
    assert shaped.num_datums == batch.num_datums


def test_no_action_tokens_is_identity_with_zero_base():
    batch = make_batch(np.zeros((2, 3)), np.zeros((2, 3)), [[1, 1, 1], [1, 0, 0]], [3, 1])
    shaped, metrics = kl_penalty_advantages(batch, np.full((2, 3), np.nan), coef=1.0, discount=0.5)
    assert float(metrics["kl_policy_base"]) == 0.0
    np.testing.assert_array_equal(shaped.advantages_D_T, batch.advantages_D_T)


def test_traced_once_for_same_shapes_and_discount():
    batch, ref = golden_batch()
    kl_module._shaped_advantages.clear_cache()  # type: ignore[attr-defined]
    with count_compiles() as compiled:
        for coef in (0.1, 0.2, 0.3):
            kl_penalty_advantages(batch, ref, coef=coef, discount=0.9)
    assert compiled.traces_of(kl_module._shaped_advantages) == 1


def test_usable_inside_jit():
    batch, ref = golden_batch()
    want, _ = kl_penalty_advantages(batch, ref, coef=0.7, discount=0.3)

    @jax.jit
    def shaped_advantages(b, r):
        return kl_penalty_advantages(b, r, coef=0.7, discount=0.3)[0].advantages_D_T

    np.testing.assert_allclose(shaped_advantages(batch, ref), want.advantages_D_T, rtol=1e-6)


def test_errors():
    batch, ref = golden_batch()
    with pytest.raises(ValueError, match=r"ref_logprobs_D_T has shape \(3, 4\), expected \(3, 5\)"):
        kl_penalty_advantages(batch, ref[:, :4], coef=1.0)
    with pytest.raises(ValueError, match=r"discount must lie in \[0, 1\], got 1.5"):
        kl_penalty_advantages(batch, ref, coef=1.0, discount=1.5)
    with pytest.raises(ValueError, match="coef must be finite"):
        kl_penalty_advantages(batch, ref, coef=float("nan"))
    with pytest.raises(TypeError, match="coef must be a Python real number"):
        kl_penalty_advantages(batch, ref, coef=jnp.float32(1.0))  # type: ignore[arg-type]


# --- properties ----------------------------------------------------------------------------------


PAD_D, PAD_T = 5, 8  # drawn batches are padded to this shape (one compile per discount)


@st.composite
def shaping_problems(draw):
    num = draw(st.integers(1, PAD_D))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    lengths = np.zeros(PAD_D, np.int32)
    lengths[:num] = rng.integers(1, PAD_T + 1, num)  # a real datum has >= 1 position
    real = np.arange(PAD_T)[None, :] < lengths[:, None]
    mask = (real & (rng.uniform(size=(PAD_D, PAD_T)) < 0.6)).astype(np.float32)
    q = np.where(real, rng.uniform(-4.0, 0.0, (PAD_D, PAD_T)), 0.0)
    q = np.where(mask > 0, q, 0.0)  # packing puts 0 on observation tokens
    adv = np.where(mask > 0, rng.normal(size=(PAD_D, PAD_T)), 0.0)
    # reference logprobs: garbage wherever the mask is 0
    ref = np.where(mask > 0, q + rng.normal(scale=0.3, size=q.shape), np.nan)
    batch = make_batch(q, mask, adv, lengths, num_datums=num)
    coef = draw(st.sampled_from([0.0, 0.01, 0.5, 3.0]))
    discount = draw(st.sampled_from([0.0, 0.5, 0.9, 1.0]))
    return batch, ref.astype(np.float32), coef, discount


def reference_shaping(batch: DatumBatch, ref, coef, discount):
    """Slow float64 reference following the cookbook, datum by datum over its real length."""
    q = np.asarray(batch.logprobs_D_T, np.float64)
    mask = np.asarray(batch.mask_D_T, np.float64)
    adv = np.asarray(batch.advantages_D_T, np.float64).copy()
    lengths = np.asarray(batch.length_D)
    diffs = []
    for d in range(batch.num_datums):
        n = int(lengths[d])
        diffs.append([(q[d, t] - ref[d, t]) * mask[d, t] if mask[d, t] else 0.0 for t in range(n)])
    total = sum(mask[d, : int(lengths[d])].sum() for d in range(batch.num_datums))
    avg = sum(sum(row) for row in diffs) / total if total else 0.0
    for d in range(batch.num_datums):
        n = int(lengths[d])
        x = [coef * mask[d, t] * (avg - diffs[d][t]) for t in range(n)]
        if discount > 0:
            out, running = [0.0] * n, 0.0
            for t in range(n - 1, -1, -1):
                running = x[t] + discount * running
                out[t] = running
            x = out
        for t in range(n):
            adv[d, t] += x[t]
    return adv, avg


@settings(max_examples=60, deadline=None)
@given(shaping_problems())
def test_matches_float64_loop_reference(problem):
    batch, ref, coef, discount = problem
    shaped, metrics = kl_penalty_advantages(batch, ref, coef=coef, discount=discount)
    want_adv, want_avg = reference_shaping(batch, ref, coef, discount)
    assert float(metrics["kl_policy_base"]) == pytest.approx(want_avg, rel=1e-5, abs=1e-5)
    np.testing.assert_allclose(shaped.advantages_D_T, want_adv, rtol=1e-4, atol=1e-4)


@settings(max_examples=40, deadline=None)
@given(shaping_problems())
def test_properties(problem):
    batch, ref, coef, discount = problem
    adv = np.asarray(batch.advantages_D_T)
    mask = np.asarray(batch.mask_D_T)
    shaped, _ = kl_penalty_advantages(batch, ref, coef=coef, discount=discount)
    new = np.asarray(shaped.advantages_D_T)
    assert np.all(np.isfinite(new))
    # Positions past each datum's last action token (all padding included) are untouched.
    last_action = np.where(mask.any(1), mask.shape[1] - 1 - np.argmax(mask[:, ::-1] > 0, 1), -1)
    after = np.arange(mask.shape[1])[None, :] > last_action[:, None]
    np.testing.assert_array_equal(new[after], adv[after])
    # Zero coefficient is the identity.
    same, _ = kl_penalty_advantages(batch, ref, coef=0.0, discount=discount)
    np.testing.assert_array_equal(same.advantages_D_T, adv)
    # Without discounting the added term is zero off the mask and sums to ~0 over the batch.
    flat, _ = kl_penalty_advantages(batch, ref, coef=coef, discount=0.0)
    added = np.asarray(flat.advantages_D_T, np.float64) - adv
    assert np.all(added[mask == 0] == 0.0)
    assert abs(added.sum()) <= 1e-4 * max(1.0, np.abs(added).sum())


def test_doctests():
    result = doctest.testmod(kl_module)
    assert result.failed == 0
    assert result.attempted > 0


# --- shape checks: a mis-shaped argument is refused, not broadcast -----------------------------


@pytest.mark.parametrize(
    ("field", "shape"),
    [("mask_D_T", (1, 5)), ("mask_D_T", (3, 1)), ("advantages_D_T", (3, 4))],
)
def test_mis_shaped_batch_field_names_it_and_both_shapes(field, shape):
    batch, ref = golden_batch()
    bad = replace(batch, **{field: np.zeros(shape, np.float32)})
    want = (
        f"kl_penalty_advantages: batch.{field} has shape {shape}, expected (3, 5) "
        "(the shape of batch.logprobs_D_T)"
    )
    with pytest.raises(ValueError, match=re.escape(want)):
        kl_penalty_advantages(bad, ref, coef=1.0)


def test_mis_shaped_reference_names_it_also_inside_jit():
    batch, ref = golden_batch()
    want = (
        "kl_penalty_advantages: ref_logprobs_D_T has shape (1, 5), expected (3, 5) "
        "(the shape of batch.logprobs_D_T)"
    )
    with pytest.raises(ValueError, match=re.escape(want)):
        jax.jit(lambda b, r: kl_penalty_advantages(b, r, coef=1.0)[0])(batch, ref[:1])


def test_discounted_future_sum_refuses_a_non_scalar_discount():
    """A `[D]` discount used to broadcast into a silent per-row discount."""
    values = jnp.ones((2, 3))
    want = "discounted_future_sum: discount must be a scalar, got shape (2,)"
    with pytest.raises(ValueError, match=re.escape(want)):
        discounted_future_sum(values, jnp.array([0.5, 0.9]))
    np.testing.assert_array_equal(  # a 0-d array is a scalar
        discounted_future_sum(values, jnp.asarray(0.5)), discounted_future_sum(values, 0.5)
    )
