"""Tinker's six built-in losses in `jax.numpy`: same names, inputs, config keys and reduction.

Tinker computes `forward_backward(data, loss_fn=...)` on its servers; this module is the same
objective as a pure function of the learner's per-token logprobs, so the local backend trains on
exactly what Tinker would and researchers can test, differentiate and inspect it. Look losses
up by Tinker name with `LOSSES` and `compute_loss` (`rlpure.losses._registry`); the
`LossOutput` record, the input checks and the ratio metrics they share live in
`rlpure.losses._common`. All of them are exported by the facade `rlpure.losses`.

Conventions:
- Arrays are padded `[D, T]` (datums × token positions), aligned with the *targets*: position
  `t` holds the learner logprob of target token `t` (see `rlpure.packing`), exactly like one
  row of Tinker's `loss_fn_inputs`. Notation per token: `lp` = learner logprob of the target
  (`target_logprobs_D_T`, the argument we differentiate), `q` = sampling logprob (input
  `logprobs`), `A` = `advantages`, `r = exp(lp − q)`, `sg` = stop-gradient.
- Reduction is a **sum** over tokens and datums, never a mean: Tinker's losses are `.sum()`.
- `valid_mask_D_T` marks real (non-padding) positions; Tinker has no such input because its
  datums are ragged. Padding contributes exactly nothing to the loss, its gradient, or the
  metrics, whatever values it holds (even NaN/inf): every input is replaced by 0 outside the
  mask *before* any arithmetic (the "double where" idiom, so no NaN leaks into gradients).
  Real observation (prompt) positions are *not* padding: they take part exactly as on Tinker
  (for `dro` that means the quadratic term also covers them; pass a narrower mask if you want
  otherwise — that is a deliberate departure from Tinker, not a default).
- "Action positions", over which ratio diagnostics are taken, are valid positions with
  `A != 0` (Tinker's RL inputs carry no action mask; zero-advantage positions contribute
  nothing to any RL loss here except `dro`'s quadratic term).
- Metrics follow Tinker's `name:reduction` convention (`loss:sum`), so micro-batch metrics
  merge by their suffix: `loss:sum`, `action_tokens:sum`, `ratio:mean`, `ratio:min`,
  `ratio:max`, `clip_fraction:mean` (fraction of action positions whose ratio lies outside
  `[clip_low_threshold, clip_high_threshold]`). With no action positions the ratio metrics are
  1.0 (the on-policy value) and the clip fraction 0.0, never NaN.

Config defaults (Tinker docs, https://tinker-docs.thinkingmachines.ai/tinker/losses/...):
- `ppo`: `clip_low_threshold=0.8`, `clip_high_threshold=1.2` (ratio bounds; `/losses/ppo` and
  the cookbook's tutorial 202: "PPO defaults to 0.8 and 1.2").
- `cispo`: `clip_low_threshold=0.0`, `clip_high_threshold=4.0`. Tinker's `/losses/cispo` page
  documents this one-sided default ("CISPO defaults to disabling the lower bound and only
  capping the upper side"): the clipped ratio is a detached coefficient on `lp`, so a lower
  bound never zeroes a gradient but keeps applying near-full updates to tokens the policy has
  moved away from, which can make the sampler/trainer KL run away off-policy; both CISPO papers
  (MiniMax-M1, arXiv 2506.13585; ScaleRL, arXiv 2510.13786) bound only the upper side.
- `dro`: `beta` has **no default here**. The `/losses/dro` page shows `{"beta": 0.05}` only as
  a "custom beta" example and states no default; rather than guess a value that could silently
  differ from the server's, `beta` must be passed.
- `gspo`: `clip_low_threshold` / `clip_high_threshold` have **no default here** for the same
  reason: the `/losses/gspo` page writes the bounds as `1 − ε_low`, `1 + ε_high` without stating
  values (the GSPO paper, arXiv 2507.18071, uses ε = 3e-4 / 4e-4, PPO uses 0.2), so they must
  be passed. `sequence_ratio_mask` is required: the page defines the sequence ratio only over
  the tokens it marks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rlpure.losses._common import (
    LossOutput,
    as_input,
    as_logprobs,
    check_clip,
    check_finite,
    loss_output,
    ratio_metrics,
    rl_inputs,
    valid_mask,
)

__all__ = [
    "cispo_clipped_weight_loss",
    "cross_entropy_loss",
    "dro_quadratic_penalty_loss",
    "gspo_token_clipped_surrogate_loss",
    "importance_sampling_loss",
    "ppo_clipped_surrogate_loss",
]


def cross_entropy_loss(
    target_logprobs_D_T: ArrayLike,
    weights_D_T: ArrayLike,
    *,
    valid_mask_D_T: ArrayLike | None = None,
) -> LossOutput:
    """Weighted negative log-likelihood, Tinker's `cross_entropy`.

    `L = −Σ_{d,t} w_dt · lp_dt`. Gradient w.r.t. `lp_dt` is `−w_dt`.

    Top-K distillation (Tinker's `(N, K)` `target_tokens` and `weights`): with `[D, T, K]`
    logprobs of `K` target tokens per position and `[D, T, K]` weights (a teacher's
    renormalised top-K probabilities, say), `L = −Σ_{d,t,k} w_dtk · lp_dtk`, the sum of the
    `K` one-target losses.

    Args:
        target_logprobs_D_T: float `[D, T]` learner logprobs of the targets, or `[D, T, K]`.
        weights_D_T: float, the shape of `target_logprobs_D_T`: per-token weights (Tinker
            input `weights`; 0 on prompts).
        valid_mask_D_T: bool/float `[D, T]`, nonzero on real positions (default: all).

    Returns:
        `LossOutput` with metric `loss:sum`.

    Examples:
        >>> out = cross_entropy_loss(jnp.array([[-1.0, -2.0]]), jnp.array([[0.0, 1.0]]))
        >>> float(out.loss)
        2.0
        >>> top2 = cross_entropy_loss(jnp.array([[[-1.0, -3.0], [-2.0, -0.5]]]),
        ...                           jnp.array([[[0.5, 0.5], [1.0, 0.0]]]))
        >>> float(top2.loss)
        4.0
    """
    name = "cross_entropy"
    lp = as_logprobs(name, target_logprobs_D_T, top_k=True)
    weights = as_input(name, "weights", weights_D_T, lp)
    valid = valid_mask(name, valid_mask_D_T, lp)
    loss = -jnp.sum(jnp.where(valid, weights, 0) * jnp.where(valid, lp, 0))
    return loss_output(loss, lp, {})


def importance_sampling_loss(
    target_logprobs_D_T: ArrayLike,
    sampling_logprobs_D_T: ArrayLike,
    advantages_D_T: ArrayLike,
    *,
    valid_mask_D_T: ArrayLike | None = None,
) -> LossOutput:
    """Importance-weighted policy gradient (REINFORCE with an IS correction), Tinker's
    `importance_sampling`.

    `L = −Σ r·A` with `r = exp(lp − q)`; per-token gradient `∂L/∂lp = −r·A` (on-policy,
    `q = lp`, this is plain REINFORCE, `−A`).

    Args:
        target_logprobs_D_T: float `[D, T]` learner logprobs `lp` of the targets.
        sampling_logprobs_D_T: float `[D, T]` sampling logprobs `q` (Tinker input `logprobs`).
        advantages_D_T: float `[D, T]` advantages `A` (Tinker input `advantages`).
        valid_mask_D_T: bool/float `[D, T]`, nonzero on real positions (default: all).

    Returns:
        `LossOutput` with `loss:sum`, `action_tokens:sum` and `ratio:{mean,min,max}`.

    Examples:
        >>> out = importance_sampling_loss(jnp.zeros((1, 2)), jnp.zeros((1, 2)),
        ...                                jnp.array([[1.0, 2.0]]))
        >>> float(out.loss)
        -3.0
    """
    name = "importance_sampling"
    lp, lp_v, q_v, adv_v, valid, action = rl_inputs(
        name, target_logprobs_D_T, sampling_logprobs_D_T, advantages_D_T, valid_mask_D_T
    )
    ratio = jnp.exp(lp_v - q_v)
    loss = -jnp.sum(jnp.where(valid, ratio * adv_v, 0))
    return loss_output(loss, lp, ratio_metrics(ratio, action))


def ppo_clipped_surrogate_loss(
    target_logprobs_D_T: ArrayLike,
    sampling_logprobs_D_T: ArrayLike,
    advantages_D_T: ArrayLike,
    *,
    clip_low_threshold: float = 0.8,
    clip_high_threshold: float = 1.2,
    valid_mask_D_T: ArrayLike | None = None,
) -> LossOutput:
    """PPO's clipped surrogate objective, token-wise and summed, Tinker's `ppo`.

    `L = −Σ min(r·A, clip(r, lo, hi)·A)` with `r = exp(lp − q)` (Schulman et al., 2017,
    arXiv 1707.06347). `lo`/`hi` are ratio bounds (`1 − ε_low`, `1 + ε_high`), not epsilons.

    Args:
        target_logprobs_D_T: float `[D, T]` learner logprobs `lp`.
        sampling_logprobs_D_T: float `[D, T]` sampling logprobs `q` (input `logprobs`).
        advantages_D_T: float `[D, T]` advantages `A`.
        clip_low_threshold: lower ratio bound `lo` (Tinker default 0.8).
        clip_high_threshold: upper ratio bound `hi` (Tinker default 1.2).
        valid_mask_D_T: bool/float `[D, T]`, nonzero on real positions (default: all).

    Returns:
        `LossOutput` with `loss:sum`, `action_tokens:sum`, `ratio:{mean,min,max}` and
        `clip_fraction:mean`.

    Examples:
        >>> out = ppo_clipped_surrogate_loss(jnp.log(jnp.array([[1.5]])), jnp.zeros((1, 1)),
        ...                                  jnp.ones((1, 1)))
        >>> round(float(out.loss), 6)
        -1.2
    """
    name = "ppo"
    check_clip(name, clip_low_threshold, clip_high_threshold)
    lp, lp_v, q_v, adv_v, valid, action = rl_inputs(
        name, target_logprobs_D_T, sampling_logprobs_D_T, advantages_D_T, valid_mask_D_T
    )
    ratio = jnp.exp(lp_v - q_v)
    clipped = jnp.clip(ratio, clip_low_threshold, clip_high_threshold)
    objective = jnp.minimum(ratio * adv_v, clipped * adv_v)
    loss = -jnp.sum(jnp.where(valid, objective, 0))
    metrics = ratio_metrics(
        ratio, action, clip_low=clip_low_threshold, clip_high=clip_high_threshold
    )
    return loss_output(loss, lp, metrics)


def cispo_clipped_weight_loss(
    target_logprobs_D_T: ArrayLike,
    sampling_logprobs_D_T: ArrayLike,
    advantages_D_T: ArrayLike,
    *,
    clip_low_threshold: float = 0.0,
    clip_high_threshold: float = 4.0,
    valid_mask_D_T: ArrayLike | None = None,
) -> LossOutput:
    """CISPO: the clipped, detached importance ratio weights a log-likelihood term, Tinker's
    `cispo`.

    `L = −Σ sg(clip(r, lo, hi))·lp·A` (MiniMax-M1, arXiv 2506.13585). No gradient flows through
    the ratio: `∂L/∂lp = −clip(r, lo, hi)·A`, so clipping bounds a token's weight but never
    zeroes its gradient (unless `hi = 0`).

    Args:
        target_logprobs_D_T: float `[D, T]` learner logprobs `lp`.
        sampling_logprobs_D_T: float `[D, T]` sampling logprobs `q` (input `logprobs`).
        advantages_D_T: float `[D, T]` advantages `A`.
        clip_low_threshold: lower ratio bound (Tinker default 0.0: one-sided clip).
        clip_high_threshold: upper ratio bound (Tinker default 4.0).
        valid_mask_D_T: bool/float `[D, T]`, nonzero on real positions (default: all).

    Returns:
        `LossOutput` with `loss:sum`, `action_tokens:sum`, `ratio:{mean,min,max}` and
        `clip_fraction:mean`.

    Examples:
        >>> out = cispo_clipped_weight_loss(jnp.array([[-1.0]]), jnp.array([[-1.0]]),
        ...                                 jnp.array([[2.0]]))
        >>> float(out.loss)
        2.0
    """
    name = "cispo"
    check_clip(name, clip_low_threshold, clip_high_threshold)
    lp, lp_v, q_v, adv_v, valid, action = rl_inputs(
        name, target_logprobs_D_T, sampling_logprobs_D_T, advantages_D_T, valid_mask_D_T
    )
    ratio = jnp.exp(lp_v - q_v)
    weight = jax.lax.stop_gradient(jnp.clip(ratio, clip_low_threshold, clip_high_threshold))
    loss = -jnp.sum(jnp.where(valid, weight * lp_v * adv_v, 0))
    metrics = ratio_metrics(
        ratio, action, clip_low=clip_low_threshold, clip_high=clip_high_threshold
    )
    return loss_output(loss, lp, metrics)


def dro_quadratic_penalty_loss(
    target_logprobs_D_T: ArrayLike,
    sampling_logprobs_D_T: ArrayLike,
    advantages_D_T: ArrayLike,
    *,
    beta: float,
    valid_mask_D_T: ArrayLike | None = None,
) -> LossOutput:
    """DRO: log-likelihood times advantage with a quadratic log-ratio penalty, Tinker's `dro`.

    `L = −Σ (lp·A − ½·β·(lp − q)²)` (Richemond et al., 2024, arXiv 2405.19107); per-token
    gradient `∂L/∂lp = −A + β·(lp − q)`. The penalty covers every valid position, including
    prompt positions (where the cookbook's `q` is 0), exactly as Tinker sums it.

    Args:
        target_logprobs_D_T: float `[D, T]` learner logprobs `lp`.
        sampling_logprobs_D_T: float `[D, T]` sampling logprobs `q` (input `logprobs`).
        advantages_D_T: float `[D, T]` advantages `A` (the soft advantages DRO expects).
        beta: penalty strength `β` (config `beta`; required, see the module docstring).
        valid_mask_D_T: bool/float `[D, T]`, nonzero on real positions (default: all).

    Returns:
        `LossOutput` with `loss:sum`, `action_tokens:sum` and `ratio:{mean,min,max}`.

    Examples:
        >>> out = dro_quadratic_penalty_loss(jnp.array([[-1.0]]), jnp.array([[-3.0]]),
        ...                                  jnp.array([[1.0]]), beta=0.5)
        >>> float(out.loss)
        2.0
    """
    name = "dro"
    check_finite(name, "beta", beta)
    lp, lp_v, q_v, adv_v, valid, action = rl_inputs(
        name, target_logprobs_D_T, sampling_logprobs_D_T, advantages_D_T, valid_mask_D_T
    )
    diff = lp_v - q_v
    objective = lp_v * adv_v - 0.5 * beta * jnp.square(diff)
    loss = -jnp.sum(jnp.where(valid, objective, 0))
    return loss_output(loss, lp, ratio_metrics(jnp.exp(diff), action))


def gspo_token_clipped_surrogate_loss(
    target_logprobs_D_T: ArrayLike,
    sampling_logprobs_D_T: ArrayLike,
    advantages_D_T: ArrayLike,
    sequence_ratio_mask_D_T: ArrayLike,
    *,
    clip_low_threshold: float,
    clip_high_threshold: float,
    valid_mask_D_T: ArrayLike | None = None,
) -> LossOutput:
    """GSPO-token: PPO clipping on a per-datum geometric-mean ratio, Tinker's `gspo`.

    Per datum `d`, over `M_d` = valid positions where `sequence_ratio_mask != 0`:
    `s_d = exp(mean_{t ∈ M_d} (sg(lp_dt) − q_dt))`; per token `s_dt = sg(s_d)·exp(lp_dt −
    sg(lp_dt))` (value `s_d`, gradient `s_d·∂lp_dt`); `L = −Σ min(s_dt·A, clip(s_dt, lo, hi)·A)`
    (Zheng et al., 2025, arXiv 2507.18071). Per-token gradient: `−s_d·A_dt` where the unclipped
    branch is the minimum, 0 where the clip binds. A datum with empty `M_d` gets `s_d = 1`
    (Tinker's mean over an empty selection would be NaN).

    Args:
        target_logprobs_D_T: float `[D, T]` learner logprobs `lp`.
        sampling_logprobs_D_T: float `[D, T]` sampling logprobs `q` (input `logprobs`).
        advantages_D_T: float `[D, T]` advantages `A`.
        sequence_ratio_mask_D_T: float `[D, T]`, nonzero on the tokens entering the sequence
            ratio (input `sequence_ratio_mask`).
        clip_low_threshold: lower ratio bound (required; see the module docstring).
        clip_high_threshold: upper ratio bound (required).
        valid_mask_D_T: bool/float `[D, T]`, nonzero on real positions (default: all).

    Returns:
        `LossOutput` with `loss:sum`, `action_tokens:sum`, `ratio:{mean,min,max}` (of the
        per-token ratio `s_dt`) and `clip_fraction:mean`.

    Examples:
        >>> lp = jnp.log(jnp.array([[2.0, 1.0]]))  # log-ratios log 2 and 0 → s = sqrt(2)
        >>> out = gspo_token_clipped_surrogate_loss(
        ...     lp, jnp.zeros((1, 2)), jnp.array([[1.0, 1.0]]), jnp.ones((1, 2)),
        ...     clip_low_threshold=0.8, clip_high_threshold=1.2)
        >>> round(float(out.loss), 6)
        -2.4
    """
    name = "gspo"
    check_clip(name, clip_low_threshold, clip_high_threshold)
    lp, lp_v, q_v, adv_v, valid, action = rl_inputs(
        name, target_logprobs_D_T, sampling_logprobs_D_T, advantages_D_T, valid_mask_D_T
    )
    seq_mask = as_input(name, "sequence_ratio_mask", sequence_ratio_mask_D_T, lp)
    in_ratio = valid & (jnp.where(valid, seq_mask, 0) != 0)
    count_D = jnp.sum(in_ratio, axis=1)
    lp_sg = jax.lax.stop_gradient(lp_v)
    log_ratio_sum_D = jnp.sum(jnp.where(in_ratio, lp_sg - q_v, 0), axis=1)
    log_ratio_D = log_ratio_sum_D / jnp.maximum(count_D, 1).astype(lp.dtype)
    ratio = jnp.exp(log_ratio_D[:, None] + lp_v - lp_sg)
    clipped = jnp.clip(ratio, clip_low_threshold, clip_high_threshold)
    objective = jnp.minimum(ratio * adv_v, clipped * adv_v)
    loss = -jnp.sum(jnp.where(valid, objective, 0))
    metrics = ratio_metrics(
        ratio, action, clip_low=clip_low_threshold, clip_high=clip_high_threshold
    )
    return loss_output(loss, lp, metrics)
