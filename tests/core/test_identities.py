"""Algebraic identities between related core functions (rlax style): two routes to one number.

Each test states an identity that holds by the formulas, across modules where it can:
estimators against each other, aggregation modes against each other and against the loss they
feed, the two KL estimates (`kl_penalty_advantages`' base and `kl_sample_train_metrics`' v1),
and Tinker's losses at special points (on-policy, `beta = 0`, a constant log-ratio per datum).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpure.advantages import (
    aggregate_batch_token_mean,
    aggregate_constant_length,
    aggregate_sequence_token_mean,
    aggregate_token_sum,
    group_centered_advantages,
    group_normalized_advantages,
    leave_one_out_advantages,
)
from rlpure.kl import discounted_future_sum, kl_penalty_advantages
from rlpure.losses import (
    cispo_clipped_weight_loss,
    cross_entropy_loss,
    dro_quadratic_penalty_loss,
    gspo_token_clipped_surrogate_loss,
    importance_sampling_loss,
    ppo_clipped_surrogate_loss,
)
from rlpure.metrics import kl_sample_train_metrics
from rlpure.packing import DatumBatch
from rlpure.testing import ragged_rewards

F32 = np.float32
PAD_P, PAD_G = 8, 8  # one padded rewards shape: one compile per estimator
PAD_D, PAD_T = 4, 6  # one padded batch shape


def _padded_rewards(rewards_P: tuple[tuple[float, ...], ...]) -> tuple[np.ndarray, np.ndarray]:
    rewards_P_G = np.zeros((PAD_P, PAD_G), F32)
    valid_P_G = np.zeros((PAD_P, PAD_G), bool)
    for p, rewards_G in enumerate(rewards_P):
        rewards_P_G[p, : len(rewards_G)] = rewards_G
        valid_P_G[p, : len(rewards_G)] = True
    return rewards_P_G, valid_P_G


def _batch(rng: np.random.Generator, mask_D_T: np.ndarray) -> DatumBatch:
    """A `[PAD_D, PAD_T]` batch over every position: random logprobs and advantages on the mask."""
    d, t = mask_D_T.shape
    on = mask_D_T > 0
    return DatumBatch(
        input_tokens_D_T=np.ones((d, t), np.int32),
        target_tokens_D_T=np.ones((d, t), np.int32),
        logprobs_D_T=np.where(on, rng.uniform(-4.0, -0.1, (d, t)), 0.0).astype(F32),
        advantages_D_T=np.where(on, rng.normal(size=(d, t)), 0.0).astype(F32),
        mask_D_T=mask_D_T.astype(F32),
        length_D=np.full(d, t, np.int32),
        group_idx_D=np.zeros(d, np.int32),
        traj_idx_D=np.zeros(d, np.int32),
        num_datums=d,
    )


seeds = st.integers(0, 2**32 - 1)


# --- advantages --------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(ragged_rewards(max_groups=PAD_P, max_group_size=PAD_G, reward_kind="float"))
def test_leave_one_out_is_g_over_g_minus_one_times_centered(rewards_P) -> None:
    """RLOO: `R - (S - R)/(G - 1) = G/(G - 1) * (R - S/G)`; a group of one gets 0 from both."""
    rewards_P_G, valid_P_G = _padded_rewards(rewards_P)
    centered = np.asarray(group_centered_advantages(rewards_P_G, valid_P_G), np.float64)
    loo = np.asarray(leave_one_out_advantages(rewards_P_G, valid_P_G), np.float64)
    for p, rewards_G in enumerate(rewards_P):
        g = len(rewards_G)
        scale = max(abs(r) for r in rewards_G) + 1.0
        if g == 1:
            assert loo[p, 0] == centered[p, 0] == 0.0
            continue
        np.testing.assert_allclose(
            loo[p, :g], g / (g - 1) * centered[p, :g], rtol=0, atol=32 * 2.0**-23 * scale
        )
    np.testing.assert_array_equal(loo[~valid_P_G], 0.0)


@settings(max_examples=40, deadline=None)
@given(
    ragged_rewards(min_groups=1, max_groups=1, max_group_size=PAD_G, reward_kind="float"),
    st.sampled_from((0, 1)),
)
def test_batch_std_of_a_single_group_is_its_group_std(rewards_P, ddof: int) -> None:
    """With one real group (the others padding), `scope="batch"` equals `scope="group"`."""
    rewards_P_G, valid_P_G = _padded_rewards(rewards_P)
    group = group_normalized_advantages(rewards_P_G, valid_P_G, scope="group", ddof=ddof)
    batch = group_normalized_advantages(rewards_P_G, valid_P_G, scope="batch", ddof=ddof)
    np.testing.assert_allclose(np.asarray(batch), np.asarray(group), rtol=2e-5, atol=2e-5)


@settings(max_examples=40, deadline=None)
@given(ragged_rewards(max_groups=PAD_P, max_group_size=PAD_G, reward_kind="float"))
def test_normalized_with_zero_eps_times_group_std_is_centered(rewards_P) -> None:
    """GRPO's `(R - mean_p) / std_p` with `eps = 0` is the centred advantage over the root mean
    square of the group's centred advantages (population std); constant groups get 0."""
    rewards_P_G, valid_P_G = _padded_rewards(rewards_P)
    centered = np.asarray(group_centered_advantages(rewards_P_G, valid_P_G), np.float64)
    normalized = np.asarray(
        group_normalized_advantages(rewards_P_G, valid_P_G, eps=0.0), np.float64
    )
    for p, rewards_G in enumerate(rewards_P):
        g = len(rewards_G)
        r = np.asarray(rewards_G, F32).astype(np.float64)
        if np.all(r == r[0]):
            np.testing.assert_array_equal(normalized[p, :g], 0.0)
            continue
        rms = float(np.sqrt(np.mean(np.square(centered[p, :g]))))
        np.testing.assert_allclose(normalized[p, :g], centered[p, :g] / rms, rtol=1e-5, atol=1e-5)


# --- aggregation -------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(seeds)
def test_sequence_mean_of_one_token_datums_is_the_token_sum(seed: int) -> None:
    """With at most one trained token per datum, dividing by its token count divides by 1."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((PAD_D, PAD_T), F32)
    rows = rng.random(PAD_D) < 0.8
    mask[rows, rng.integers(0, PAD_T, PAD_D)[rows]] = 1.0
    batch = _batch(rng, mask)
    np.testing.assert_array_equal(
        aggregate_sequence_token_mean(batch).advantages_D_T,
        aggregate_token_sum(batch).advantages_D_T,
    )


@settings(max_examples=40, deadline=None)
@given(seeds, st.integers(1, PAD_T))
def test_constant_length_equal_to_every_datums_token_count_is_the_sequence_mean(
    seed: int, n: int
) -> None:
    """Dr. GRPO's `A / L` is GRPO's `A / |o_d|` when every datum trains exactly `L` tokens;
    with one datum that is also DAPO's batch token mean."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((PAD_D, PAD_T), F32)
    for d in range(PAD_D):
        mask[d, rng.choice(PAD_T, n, replace=False)] = 1.0
    batch = _batch(rng, mask)
    sequence = np.asarray(aggregate_sequence_token_mean(batch).advantages_D_T)
    constant = np.asarray(aggregate_constant_length(batch, length=float(n)).advantages_D_T)
    np.testing.assert_array_equal(constant, sequence)
    one = _batch(rng, mask[:1])
    np.testing.assert_array_equal(
        aggregate_batch_token_mean(one).advantages_D_T,
        aggregate_sequence_token_mean(one).advantages_D_T,
    )


@settings(max_examples=30, deadline=None)
@given(seeds)
def test_on_policy_loss_of_sequence_mean_advantages_is_minus_the_sum_of_datum_means(
    seed: int,
) -> None:
    """The aggregation realises its objective through Tinker's token-summing loss: on-policy,
    `importance_sampling` on sequence-mean advantages is `-Σ_d mean_{t in mask_d} A_dt`."""
    rng = np.random.default_rng(seed)
    mask = (rng.random((PAD_D, PAD_T)) < 0.5).astype(F32)
    batch = _batch(rng, mask)
    scaled = aggregate_sequence_token_mean(batch)
    lp = jnp.asarray(batch.logprobs_D_T)
    out = importance_sampling_loss(lp, lp, scaled.advantages_D_T, valid_mask_D_T=batch.mask_D_T)
    adv = np.asarray(batch.advantages_D_T, np.float64)
    want = -sum(adv[d][mask[d] > 0].mean() for d in range(PAD_D) if mask[d].any())
    assert float(out.loss) == pytest.approx(want, rel=1e-5, abs=1e-5)


# --- KL ----------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(seeds)
def test_kl_policy_base_against_the_learner_is_kl_sample_train_v1(seed: int) -> None:
    """Both are the k1 estimate `mean_{mask} (q - lp)`: the KL penalty's batch mean with the
    learner as reference equals the sampler-vs-learner metric."""
    rng = np.random.default_rng(seed)
    mask = (rng.random((PAD_D, PAD_T)) < 0.6).astype(F32)
    mask[0, 0] = 1.0  # at least one action token (the metric refuses none)
    batch = _batch(rng, mask)
    learner = (np.asarray(batch.logprobs_D_T) + rng.normal(scale=0.3, size=mask.shape)).astype(F32)
    _, shaped_metrics = kl_penalty_advantages(batch, learner, coef=1.0)
    metrics = kl_sample_train_metrics(batch.logprobs_D_T, learner, batch.mask_D_T)
    assert float(shaped_metrics["kl_policy_base"]) == pytest.approx(
        metrics["optim/kl_sample_train_v1"], rel=1e-5, abs=1e-6
    )


@settings(max_examples=30, deadline=None)
@given(seeds, st.sampled_from((0.0, 0.5, 1.0)))
def test_kl_against_itself_is_zero_and_shapes_nothing(seed: int, discount: float) -> None:
    """`ref = q` on the mask: `d = 0` everywhere, so the base is 0 and advantages are kept;
    the sampler-vs-learner metrics of `q` against itself are 0 (v1, v2) and `-mean q`."""
    rng = np.random.default_rng(seed)
    mask = (rng.random((PAD_D, PAD_T)) < 0.6).astype(F32)
    mask[0, 0] = 1.0
    batch = _batch(rng, mask)
    shaped, metrics = kl_penalty_advantages(batch, batch.logprobs_D_T, coef=2.0, discount=discount)
    assert float(metrics["kl_policy_base"]) == 0.0
    np.testing.assert_array_equal(shaped.advantages_D_T, batch.advantages_D_T)
    m = kl_sample_train_metrics(batch.logprobs_D_T, batch.logprobs_D_T, batch.mask_D_T)
    assert m["optim/kl_sample_train_v1"] == 0.0 and m["optim/kl_sample_train_v2"] == 0.0
    q = np.asarray(batch.logprobs_D_T, np.float64)[mask > 0]
    assert m["optim/entropy"] == pytest.approx(-q.mean(), rel=1e-6)


@settings(max_examples=30, deadline=None)
@given(seeds)
def test_discounted_future_sum_at_zero_and_one(seed: int) -> None:
    """`γ = 0` is the identity; `γ = 1` is the reversed cumulative sum (suffix sums)."""
    values = np.random.default_rng(seed).normal(size=(PAD_D, PAD_T)).astype(F32)
    np.testing.assert_array_equal(discounted_future_sum(values, 0.0), values)
    suffix = np.cumsum(values[:, ::-1].astype(np.float64), axis=1)[:, ::-1]
    np.testing.assert_allclose(discounted_future_sum(values, 1.0), suffix, rtol=1e-5, atol=1e-5)


# --- losses ------------------------------------------------------------------------------------


def _loss_problem(seed: int) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """`lp`, `q`, `A` and a valid mask `[PAD_D, PAD_T]`."""
    rng = np.random.default_rng(seed)
    lp = jnp.asarray(rng.uniform(-4.0, -0.1, (PAD_D, PAD_T)), jnp.float32)
    q = jnp.asarray(rng.uniform(-4.0, -0.1, (PAD_D, PAD_T)), jnp.float32)
    adv = jnp.asarray(rng.normal(size=(PAD_D, PAD_T)), jnp.float32)
    valid = jnp.asarray(rng.random((PAD_D, PAD_T)) < 0.8)
    return lp, q, adv, valid


@settings(max_examples=30, deadline=None)
@given(seeds)
def test_on_policy_importance_sampling_and_ppo_are_minus_the_advantage_sum(seed: int) -> None:
    """`lp = q`: every ratio is 1 (inside any clip range), so both losses are `-Σ_valid A`."""
    lp, _, adv, valid = _loss_problem(seed)
    want = -float(jnp.sum(jnp.where(valid, adv, 0.0)))
    is_loss = importance_sampling_loss(lp, lp, adv, valid_mask_D_T=valid).loss
    ppo_loss = ppo_clipped_surrogate_loss(lp, lp, adv, valid_mask_D_T=valid).loss
    assert float(is_loss) == pytest.approx(want, rel=1e-5, abs=1e-5)
    assert float(ppo_loss) == pytest.approx(want, rel=1e-5, abs=1e-5)


@settings(max_examples=30, deadline=None)
@given(seeds)
def test_dro_without_penalty_is_cross_entropy_weighted_by_advantages(seed: int) -> None:
    """`β = 0`: `-Σ lp·A` whatever `q`, i.e. `cross_entropy` with weights `A`; so is on-policy
    CISPO (its detached weight `clip(1) = 1`)."""
    lp, q, adv, valid = _loss_problem(seed)
    dro = dro_quadratic_penalty_loss(lp, q, adv, beta=0.0, valid_mask_D_T=valid).loss
    ce = cross_entropy_loss(lp, adv, valid_mask_D_T=valid).loss
    cispo = cispo_clipped_weight_loss(lp, lp, adv, valid_mask_D_T=valid).loss
    assert float(dro) == pytest.approx(float(ce), rel=1e-6, abs=1e-5)
    assert float(cispo) == pytest.approx(float(ce), rel=1e-6, abs=1e-5)


@settings(max_examples=30, deadline=None)
@given(seeds)
def test_gspo_with_a_constant_log_ratio_per_datum_is_ppo(seed: int) -> None:
    """When `lp - q = c_d` on every position of datum `d`, the sequence ratio `exp(c_d)` is
    every token's ratio, so GSPO-token equals PPO in value and gradient."""
    lp, _, adv, valid = _loss_problem(seed)
    shift_D_1 = jnp.asarray(np.random.default_rng(seed + 1).uniform(-0.3, 0.3, (PAD_D, 1)), F32)
    q = lp - shift_D_1
    clip = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}

    def gspo(x: jax.Array) -> jax.Array:
        return gspo_token_clipped_surrogate_loss(
            x, q, adv, jnp.ones_like(x), valid_mask_D_T=valid, **clip
        ).loss

    def ppo(x: jax.Array) -> jax.Array:
        return ppo_clipped_surrogate_loss(x, q, adv, valid_mask_D_T=valid, **clip).loss

    assert float(gspo(lp)) == pytest.approx(float(ppo(lp)), rel=1e-5, abs=1e-5)
    np.testing.assert_allclose(jax.grad(gspo)(lp), jax.grad(ppo)(lp), rtol=1e-5, atol=1e-6)
