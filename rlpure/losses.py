"""Tinker's built-in losses in `jax.numpy`: same names, inputs, config keys and reduction.

Tinker computes `forward_backward(data, loss_fn=...)` on its servers; this module is the same
objective as a pure function of the learner's per-token logprobs, so the local backend trains on
exactly what Tinker would and researchers can test, differentiate and inspect it.

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

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp
import msgspec
from jax.typing import ArrayLike

from rlpure.packing import DatumBatch

__all__ = [
    "KNOWN_LOSS_INPUTS",
    "LOSSES",
    "LossOutput",
    "LossSpec",
    "cispo_clipped_weight_loss",
    "compute_loss",
    "cross_entropy_loss",
    "dro_quadratic_penalty_loss",
    "gspo_token_clipped_surrogate_loss",
    "importance_sampling_loss",
    "loss_fn_inputs_from_batch",
    "ppo_clipped_surrogate_loss",
]

KNOWN_LOSS_INPUTS = frozenset(
    {"target_tokens", "weights", "logprobs", "advantages", "sequence_ratio_mask"}
)
"""Tinker `loss_fn_inputs` names `compute_loss` understands (others are refused, e.g. `mask`)."""


class LossOutput(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """What a loss returns (Tinker's `loss`, `loss_fn_outputs["logprobs"]` and `metrics`).

    Registered as a pytree, so it can be returned from `jit` and used as the auxiliary output
    of `jax.value_and_grad(..., has_aux=True)`.

    Attributes:
        loss: float scalar, the summed loss (differentiable in `target_logprobs_D_T`).
        target_logprobs_D_T: float `[D, T]`, the learner logprobs passed in (Tinker's
            per-datum output `logprobs`), unchanged.
        metrics: scalar diagnostics keyed `name:reduction`; at least `loss:sum`. They are
            stop-gradient'ed.
    """

    loss: jax.Array
    target_logprobs_D_T: jax.Array
    metrics: dict[str, jax.Array]


jax.tree_util.register_dataclass(
    LossOutput, data_fields=["loss", "target_logprobs_D_T", "metrics"], meta_fields=[]
)


# --- checks and helpers ----------------------------------------------------------------------


def _as_logprobs(loss: str, target_logprobs_D_T: ArrayLike) -> jax.Array:
    lp = jnp.asarray(target_logprobs_D_T)
    if lp.ndim != 2:
        raise ValueError(f"{loss}: target_logprobs_D_T must be [D, T], got shape {lp.shape}")
    if not jnp.issubdtype(lp.dtype, jnp.floating):
        raise TypeError(f"{loss}: target_logprobs_D_T must be floating, got dtype {lp.dtype}")
    return lp


def _as_input(loss: str, field: str, values: ArrayLike, lp: jax.Array) -> jax.Array:
    arr = jnp.asarray(values)
    if arr.shape != lp.shape:
        raise ValueError(
            f"{loss}: input {field!r} has shape {arr.shape}, expected {lp.shape} "
            "(the shape of target_logprobs_D_T)"
        )
    return arr.astype(lp.dtype)


def _valid_mask(loss: str, valid_mask_D_T: ArrayLike | None, lp: jax.Array) -> jax.Array:
    if valid_mask_D_T is None:
        return jnp.ones(lp.shape, bool)
    valid = jnp.asarray(valid_mask_D_T)
    if valid.shape != lp.shape:
        raise ValueError(
            f"{loss}: valid_mask_D_T has shape {valid.shape}, expected {lp.shape} "
            "(the shape of target_logprobs_D_T)"
        )
    return valid != 0


def _check_finite(loss: str, key: str, value: Any) -> None:
    """Checks a hyper-parameter when it is a concrete number (it may be traced under `jit`)."""
    if isinstance(value, bool):
        raise TypeError(f"{loss}: config {key!r} must be a real number, got bool")
    if isinstance(value, (int, float)) and not math.isfinite(value):
        raise ValueError(f"{loss}: config {key!r} must be finite, got {value}")


def _check_clip(loss: str, low: Any, high: Any) -> None:
    _check_finite(loss, "clip_low_threshold", low)
    _check_finite(loss, "clip_high_threshold", high)
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and not 0 <= low <= high:
        raise ValueError(
            f"{loss}: need 0 <= clip_low_threshold <= clip_high_threshold, "
            f"got clip_low_threshold={low}, clip_high_threshold={high}"
        )


def _ratio_metrics(
    ratio_D_T: jax.Array,
    action_D_T: jax.Array,
    *,
    clip_low: Any = None,
    clip_high: Any = None,
) -> dict[str, jax.Array]:
    """Ratio diagnostics over action positions (1.0 / 0.0 when there are none)."""
    ratio = jax.lax.stop_gradient(ratio_D_T)
    count = jnp.sum(action_D_T)
    has_any = count > 0
    denom = jnp.maximum(count, 1).astype(ratio.dtype)
    one = jnp.ones((), ratio.dtype)
    safe = jnp.where(action_D_T, ratio, one)
    metrics = {
        "action_tokens:sum": count.astype(ratio.dtype),
        "ratio:mean": jnp.where(has_any, jnp.sum(jnp.where(action_D_T, ratio, 0)) / denom, one),
        "ratio:min": jnp.where(has_any, jnp.min(jnp.where(action_D_T, ratio, jnp.inf)), one),
        "ratio:max": jnp.where(has_any, jnp.max(jnp.where(action_D_T, ratio, -jnp.inf)), one),
    }
    if clip_low is not None:
        outside = action_D_T & ((safe < clip_low) | (safe > clip_high))
        metrics["clip_fraction:mean"] = jnp.sum(outside).astype(ratio.dtype) / denom
    return metrics


def _output(loss: jax.Array, lp: jax.Array, metrics: dict[str, jax.Array]) -> LossOutput:
    return LossOutput(
        loss=loss,
        target_logprobs_D_T=lp,
        metrics={"loss:sum": jax.lax.stop_gradient(loss), **metrics},
    )


def _rl_inputs(
    loss: str,
    target_logprobs_D_T: ArrayLike,
    sampling_logprobs_D_T: ArrayLike,
    advantages_D_T: ArrayLike,
    valid_mask_D_T: ArrayLike | None,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """Returns (lp, lp zeroed off-mask, q zeroed, A zeroed, valid, action)."""
    lp = _as_logprobs(loss, target_logprobs_D_T)
    q = _as_input(loss, "logprobs", sampling_logprobs_D_T, lp)
    adv = _as_input(loss, "advantages", advantages_D_T, lp)
    valid = _valid_mask(loss, valid_mask_D_T, lp)
    lp_v = jnp.where(valid, lp, 0)
    q_v = jnp.where(valid, q, 0)
    adv_v = jnp.where(valid, adv, 0)
    return lp, lp_v, q_v, adv_v, valid, valid & (adv_v != 0)


# --- the losses ------------------------------------------------------------------------------


def cross_entropy_loss(
    target_logprobs_D_T: ArrayLike,
    weights_D_T: ArrayLike,
    *,
    valid_mask_D_T: ArrayLike | None = None,
) -> LossOutput:
    """Weighted negative log-likelihood, Tinker's `cross_entropy`.

    `L = −Σ_{d,t} w_dt · lp_dt`. Gradient w.r.t. `lp_dt` is `−w_dt`.

    Args:
        target_logprobs_D_T: float `[D, T]` learner logprobs of the targets.
        weights_D_T: float `[D, T]` per-token weights (Tinker input `weights`; 0 on prompts).
        valid_mask_D_T: bool/float `[D, T]`, nonzero on real positions (default: all).

    Returns:
        `LossOutput` with metric `loss:sum`.

    Examples:
        >>> out = cross_entropy_loss(jnp.array([[-1.0, -2.0]]), jnp.array([[0.0, 1.0]]))
        >>> float(out.loss)
        2.0
    """
    name = "cross_entropy"
    lp = _as_logprobs(name, target_logprobs_D_T)
    weights = _as_input(name, "weights", weights_D_T, lp)
    valid = _valid_mask(name, valid_mask_D_T, lp)
    loss = -jnp.sum(jnp.where(valid, weights, 0) * jnp.where(valid, lp, 0))
    return _output(loss, lp, {})


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
    lp, lp_v, q_v, adv_v, valid, action = _rl_inputs(
        name, target_logprobs_D_T, sampling_logprobs_D_T, advantages_D_T, valid_mask_D_T
    )
    ratio = jnp.exp(lp_v - q_v)
    loss = -jnp.sum(jnp.where(valid, ratio * adv_v, 0))
    return _output(loss, lp, _ratio_metrics(ratio, action))


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
    _check_clip(name, clip_low_threshold, clip_high_threshold)
    lp, lp_v, q_v, adv_v, valid, action = _rl_inputs(
        name, target_logprobs_D_T, sampling_logprobs_D_T, advantages_D_T, valid_mask_D_T
    )
    ratio = jnp.exp(lp_v - q_v)
    clipped = jnp.clip(ratio, clip_low_threshold, clip_high_threshold)
    objective = jnp.minimum(ratio * adv_v, clipped * adv_v)
    loss = -jnp.sum(jnp.where(valid, objective, 0))
    metrics = _ratio_metrics(
        ratio, action, clip_low=clip_low_threshold, clip_high=clip_high_threshold
    )
    return _output(loss, lp, metrics)


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
    _check_clip(name, clip_low_threshold, clip_high_threshold)
    lp, lp_v, q_v, adv_v, valid, action = _rl_inputs(
        name, target_logprobs_D_T, sampling_logprobs_D_T, advantages_D_T, valid_mask_D_T
    )
    ratio = jnp.exp(lp_v - q_v)
    weight = jax.lax.stop_gradient(jnp.clip(ratio, clip_low_threshold, clip_high_threshold))
    loss = -jnp.sum(jnp.where(valid, weight * lp_v * adv_v, 0))
    metrics = _ratio_metrics(
        ratio, action, clip_low=clip_low_threshold, clip_high=clip_high_threshold
    )
    return _output(loss, lp, metrics)


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
    _check_finite(name, "beta", beta)
    lp, lp_v, q_v, adv_v, valid, action = _rl_inputs(
        name, target_logprobs_D_T, sampling_logprobs_D_T, advantages_D_T, valid_mask_D_T
    )
    diff = lp_v - q_v
    objective = lp_v * adv_v - 0.5 * beta * jnp.square(diff)
    loss = -jnp.sum(jnp.where(valid, objective, 0))
    return _output(loss, lp, _ratio_metrics(jnp.exp(diff), action))


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
    _check_clip(name, clip_low_threshold, clip_high_threshold)
    lp, lp_v, q_v, adv_v, valid, action = _rl_inputs(
        name, target_logprobs_D_T, sampling_logprobs_D_T, advantages_D_T, valid_mask_D_T
    )
    seq_mask = _as_input(name, "sequence_ratio_mask", sequence_ratio_mask_D_T, lp)
    in_ratio = valid & (jnp.where(valid, seq_mask, 0) != 0)
    count_D = jnp.sum(in_ratio, axis=1)
    lp_sg = jax.lax.stop_gradient(lp_v)
    log_ratio_sum_D = jnp.sum(jnp.where(in_ratio, lp_sg - q_v, 0), axis=1)
    log_ratio_D = log_ratio_sum_D / jnp.maximum(count_D, 1).astype(lp.dtype)
    ratio = jnp.exp(log_ratio_D[:, None] + lp_v - lp_sg)
    clipped = jnp.clip(ratio, clip_low_threshold, clip_high_threshold)
    objective = jnp.minimum(ratio * adv_v, clipped * adv_v)
    loss = -jnp.sum(jnp.where(valid, objective, 0))
    metrics = _ratio_metrics(
        ratio, action, clip_low=clip_low_threshold, clip_high=clip_high_threshold
    )
    return _output(loss, lp, metrics)


# --- registry and entry point ----------------------------------------------------------------


class LossSpec(msgspec.Struct, frozen=True, kw_only=True):
    """How a Tinker loss name maps onto a function here.

    Attributes:
        name: Tinker's `loss_fn` string.
        loss_fn: the function; called as `loss_fn(target_logprobs_D_T, *arrays,
            valid_mask_D_T=..., **config)` with `arrays` taken from `array_inputs`.
        required_inputs: `loss_fn_inputs` names Tinker requires for this loss (includes
            `target_tokens`, which the maths does not read because the logprobs of the targets
            are given, but which a Tinker datum must carry).
        array_inputs: the inputs passed positionally to `loss_fn`, in order.
        config_defaults: `loss_fn_config` keys with their documented Tinker defaults.
        required_config: `loss_fn_config` keys without a documented default (must be passed).
        reference: the Tinker documentation page.
    """

    name: str
    loss_fn: Callable[..., LossOutput]
    required_inputs: tuple[str, ...]
    array_inputs: tuple[str, ...]
    config_defaults: Mapping[str, float]
    required_config: tuple[str, ...] = ()
    reference: str = ""

    @property
    def config_keys(self) -> frozenset[str]:
        return frozenset(self.config_defaults) | frozenset(self.required_config)


_DOCS = "https://tinker-docs.thinkingmachines.ai/tinker/losses"
_RL_INPUTS = ("logprobs", "advantages")

LOSSES: Mapping[str, LossSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            LossSpec(
                name="cross_entropy",
                loss_fn=cross_entropy_loss,
                required_inputs=("target_tokens", "weights"),
                array_inputs=("weights",),
                config_defaults=MappingProxyType({}),
                reference=_DOCS,
            ),
            LossSpec(
                name="importance_sampling",
                loss_fn=importance_sampling_loss,
                required_inputs=("target_tokens", *_RL_INPUTS),
                array_inputs=_RL_INPUTS,
                config_defaults=MappingProxyType({}),
                reference=_DOCS,
            ),
            LossSpec(
                name="ppo",
                loss_fn=ppo_clipped_surrogate_loss,
                required_inputs=("target_tokens", *_RL_INPUTS),
                array_inputs=_RL_INPUTS,
                config_defaults=MappingProxyType(
                    {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
                ),
                reference=f"{_DOCS}/ppo",
            ),
            LossSpec(
                name="cispo",
                loss_fn=cispo_clipped_weight_loss,
                required_inputs=("target_tokens", *_RL_INPUTS),
                array_inputs=_RL_INPUTS,
                config_defaults=MappingProxyType(
                    {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}
                ),
                reference=f"{_DOCS}/cispo",
            ),
            LossSpec(
                name="dro",
                loss_fn=dro_quadratic_penalty_loss,
                required_inputs=("target_tokens", *_RL_INPUTS),
                array_inputs=_RL_INPUTS,
                config_defaults=MappingProxyType({}),
                required_config=("beta",),
                reference=f"{_DOCS}/dro",
            ),
            LossSpec(
                name="gspo",
                loss_fn=gspo_token_clipped_surrogate_loss,
                required_inputs=("target_tokens", *_RL_INPUTS, "sequence_ratio_mask"),
                array_inputs=(*_RL_INPUTS, "sequence_ratio_mask"),
                config_defaults=MappingProxyType({}),
                required_config=("clip_low_threshold", "clip_high_threshold"),
                reference=f"{_DOCS}/gspo",
            ),
        )
    }
)
"""Tinker loss name → `LossSpec`; the one table the local backend and users look losses up in."""


def compute_loss(
    name: str,
    target_logprobs_D_T: ArrayLike,
    loss_fn_inputs: Mapping[str, ArrayLike],
    config: Mapping[str, float] | None = None,
    *,
    valid_mask_D_T: ArrayLike | None = None,
) -> LossOutput:
    """Computes Tinker's loss `name` on a padded batch, as `forward_backward` would.

    Traceable under `jax.jit` / `jax.value_and_grad` w.r.t. `target_logprobs_D_T` (and the
    inputs); `name` and `config` are plain Python values, static under `jit` (close over them or
    mark them static). Shapes are checked at trace time.

    Args:
        name: Tinker loss name, a key of `LOSSES` (`cross_entropy`, `importance_sampling`,
            `ppo`, `cispo`, `dro`, `gspo`).
        target_logprobs_D_T: float `[D, T]` learner logprobs of the target tokens.
        loss_fn_inputs: Tinker input name → zero-padded `[D, T]` array (`target_tokens`
            int, `weights`, `logprobs`, `advantages`, `sequence_ratio_mask` float). Inputs a
            loss does not read (e.g. `weights` on an RL loss) are shape-checked and ignored;
            names Tinker does not know (e.g. the cookbook's `mask`) are refused.
        config: Tinker's `loss_fn_config` (e.g. `{"clip_low_threshold": 0.9}`); missing keys
            take the documented defaults in `LOSSES[name].config_defaults`.
        valid_mask_D_T: bool/float `[D, T]`, nonzero on real (non-padding) positions; default
            all positions. Padding contributes nothing to loss, gradient or metrics.

    Returns:
        `LossOutput` (`.loss`, `.target_logprobs_D_T`, `.metrics` with at least `loss:sum`).

    Raises:
        ValueError: unknown loss name, unknown input or config key, missing input or required
            config key, or an input whose shape differs from `target_logprobs_D_T`'s (naming
            the loss, the input and both shapes).

    Examples:
        >>> lp = jnp.array([[-0.5, -1.0]])
        >>> inputs = {"target_tokens": jnp.array([[3, 4]]), "logprobs": lp,
        ...           "advantages": jnp.array([[2.0, -1.0]])}
        >>> float(compute_loss("ppo", lp, inputs).loss)
        -1.0
        >>> grad = jax.grad(lambda x: compute_loss("ppo", x, inputs).loss)(lp)
        >>> grad.tolist()
        [[-2.0, 1.0]]
    """
    spec = LOSSES.get(name)
    if spec is None:
        raise ValueError(f"unknown loss {name!r}; known losses: {', '.join(sorted(LOSSES))}")
    lp = _as_logprobs(name, target_logprobs_D_T)
    unknown = sorted(set(loss_fn_inputs) - KNOWN_LOSS_INPUTS)
    if unknown:
        raise ValueError(
            f"{name}: unknown loss_fn_inputs {unknown}; Tinker inputs are "
            f"{sorted(KNOWN_LOSS_INPUTS)}"
        )
    missing = [key for key in spec.required_inputs if key not in loss_fn_inputs]
    if missing:
        raise ValueError(
            f"{name}: missing loss_fn_inputs {missing} (required: {list(spec.required_inputs)})"
        )
    for key, values in loss_fn_inputs.items():
        shape = jnp.shape(values)
        if shape != lp.shape:
            raise ValueError(
                f"{name}: input {key!r} has shape {shape}, expected {lp.shape} "
                "(the shape of target_logprobs_D_T)"
            )
    config = dict(config or {})
    unknown = sorted(set(config) - spec.config_keys)
    if unknown:
        raise ValueError(
            f"{name}: unknown config keys {unknown}; accepted: {sorted(spec.config_keys)}"
        )
    missing = [key for key in spec.required_config if key not in config]
    if missing:
        raise ValueError(
            f"{name}: config {missing} must be given (no documented Tinker default; "
            f"see {spec.reference})"
        )
    merged = {**spec.config_defaults, **config}
    arrays = [loss_fn_inputs[key] for key in spec.array_inputs]
    return spec.loss_fn(lp, *arrays, valid_mask_D_T=valid_mask_D_T, **merged)


def loss_fn_inputs_from_batch(batch: DatumBatch) -> tuple[dict[str, jax.Array], jax.Array]:
    """Tinker-named loss inputs and the padding mask of a `DatumBatch`, for `compute_loss`.

    `target_tokens`, `logprobs`, `advantages` come from the batch; `weights` (read by
    `cross_entropy`) and `sequence_ratio_mask` (read by `gspo`: the sequence ratio is taken over
    the trained action tokens) are `mask_D_T`. The valid mask is `t < length_D[d]`.

    Returns:
        `(loss_fn_inputs, valid_mask_D_T)`: a dict of `[D, T]` arrays and a bool `[D, T]`.

    Examples:
        >>> import numpy as np
        >>> z = np.zeros((1, 2), np.float32)
        >>> batch = DatumBatch(
        ...     input_tokens_D_T=z.astype(np.int32), target_tokens_D_T=z.astype(np.int32),
        ...     logprobs_D_T=z, advantages_D_T=np.ones((1, 2), np.float32),
        ...     mask_D_T=np.array([[0.0, 1.0]], np.float32), length_D=np.array([1], np.int32),
        ...     group_idx_D=np.zeros(1, np.int32), traj_idx_D=np.zeros(1, np.int32),
        ...     num_datums=1)
        >>> inputs, valid = loss_fn_inputs_from_batch(batch)
        >>> sorted(inputs), valid.tolist()
        (['advantages', 'logprobs', 'sequence_ratio_mask', 'target_tokens', 'weights'], [[True, False]])
    """
    mask = jnp.asarray(batch.mask_D_T)
    _, T = batch.shape
    valid = jnp.arange(T)[None, :] < jnp.asarray(batch.length_D)[:, None]
    inputs = {
        "target_tokens": jnp.asarray(batch.target_tokens_D_T),
        "weights": mask,
        "logprobs": jnp.asarray(batch.logprobs_D_T),
        "advantages": jnp.asarray(batch.advantages_D_T),
        "sequence_ratio_mask": mask,
    }
    return inputs, valid
