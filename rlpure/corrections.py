"""Off-policy and training–inference mismatch corrections, DAPO's overlong shaping, KL estimators.

Conventions:
- `[D, T]` arrays are padded and aligned with the *targets*, as in `rlpure.packing` (position
  `t` holds the logprob of target token `t`). `mask_D_T` (> 0 on trained action tokens) selects
  the tokens a correction reads; values elsewhere are never read (they may be garbage, even
  NaN) and never receive a gradient.
- Every function is pure and jitted once per static option (`level`, `mode`, `estimator`);
  numeric options (`cap`, `max_length`, `buffer`) may be traced. Shapes are checked at entry
  (`ValueError` naming the argument and both shapes, never a broadcast).
- With Tinker's built-in losses the one client-side lever is the per-token advantage, so an
  importance weight corrects a batch by scaling its `advantages_D_T` before the datums are
  built (`batch.advantages_D_T * weights_D_T`); weights carry no gradient (`stop_gradient`,
  as TRL and verl compute them without one). The datums must then carry the **trainer's**
  logprobs as `logprobs` (verl's `old_log_prob`, TRL's `old_per_token_logps`): Tinker's
  losses compute their own ratio `exp(lp − logprobs)`, which with the sampler's logprobs is
  the mismatch ratio again at the pre-update weights (gradient `−r·w·A` instead of `−w·A`).
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple, get_args

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from rlpure._checks import check_rank, check_shapes_equal

__all__ = [
    "ImportanceWeights",
    "KLEstimate",
    "KLEstimator",
    "MismatchLevel",
    "MismatchMode",
    "importance_weights",
    "kl_estimate",
    "overlong_penalty",
]

MismatchLevel = Literal["token", "sequence", "geometric"]
MismatchMode = Literal["truncate", "mask"]
KLEstimator = Literal["k1", "k2", "k3"]

_METRIC_PREFIX = "mismatch/rollout_is_"


class ImportanceWeights(NamedTuple):
    """What `importance_weights` returns.

    Attributes:
        weights_D_T: float32 `[D, T]` weight of each token's advantage (1.0 where `mask_D_T`
            is 0: the correction never touches those positions); no gradient flows through it.
        metrics: float32 scalars keyed as verl's rollout correction keys them
            (`mismatch/rollout_is_mean`, ...; see `importance_weights`).
    """

    weights_D_T: jax.Array
    metrics: dict[str, jax.Array]


class KLEstimate(NamedTuple):
    """What `kl_estimate` returns.

    Attributes:
        kl_D_T: float32 `[D, T]` the estimator's value per token, 0.0 where `mask_D_T` is 0.
        mean: float32 scalar, its mean over the masked-in tokens of the whole batch (0.0 when
            there is none).
    """

    kl_D_T: jax.Array
    mean: jax.Array


def _check_choice(function: str, name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(
            f"{function}: {name} must be one of {', '.join(map(repr, choices))}, got {value!r}"
        )


def _masked_log_ratio(
    sampler_logprobs_D_T: jax.Array, trainer_logprobs_D_T: jax.Array, on_D_T: jax.Array
) -> jax.Array:
    """`trainer − sampler` on masked-in tokens, 0.0 elsewhere (garbage there never read)."""
    trainer = jnp.where(on_D_T, trainer_logprobs_D_T.astype(jnp.float32), 0.0)
    sampler = jnp.where(on_D_T, sampler_logprobs_D_T.astype(jnp.float32), 0.0)
    return trainer - sampler


def _level_log_ratio(log_ratio_D_T: jax.Array, on_D_T: jax.Array, level: str) -> jax.Array:
    """The log ratio each token is weighted by, `[D, T]`, at `level`."""
    if level == "token":
        return log_ratio_D_T
    total_D = jnp.sum(log_ratio_D_T, axis=-1, keepdims=True)
    if level == "sequence":
        return jnp.broadcast_to(total_D, log_ratio_D_T.shape)
    count_D = jnp.sum(on_D_T, axis=-1, keepdims=True)
    mean_D = total_D / jnp.maximum(count_D, 1)  # a row without tokens: log ratio 0
    return jnp.broadcast_to(mean_D, log_ratio_D_T.shape)


def _importance_weights_impl(
    sampler_logprobs_D_T: ArrayLike,
    trainer_logprobs_D_T: ArrayLike,
    mask_D_T: ArrayLike,
    cap: ArrayLike,
    *,
    level: str,
    mode: str,
) -> ImportanceWeights:
    on = jnp.asarray(mask_D_T) > 0
    log_ratio = _level_log_ratio(
        _masked_log_ratio(jnp.asarray(sampler_logprobs_D_T), jnp.asarray(trainer_logprobs_D_T), on),
        on,
        level,
    )
    log_ratio = jax.lax.stop_gradient(log_ratio)
    log_cap = jnp.log(jnp.asarray(cap, jnp.float32))
    high = on & (log_ratio > log_cap)
    low = on & (log_ratio < -log_cap)
    if mode == "truncate":
        masked = jnp.zeros_like(on)
        weights = jnp.exp(jnp.minimum(log_ratio, log_cap))
    else:
        masked = high | low
        weights = jnp.where(masked, 0.0, jnp.exp(jnp.where(masked, 0.0, log_ratio)))
    weights = jnp.where(on, weights, 1.0)
    count = jnp.sum(on)
    denominator = jnp.maximum(count, 1)
    ratio = jnp.exp(log_ratio)
    rows = jnp.any(on, axis=-1)
    metrics = {
        "mean": jnp.where(count > 0, jnp.sum(jnp.where(on, ratio, 0.0)) / denominator, 1.0),
        "min": jnp.where(count > 0, jnp.min(jnp.where(on, ratio, jnp.inf)), 1.0),
        "max": jnp.where(count > 0, jnp.max(jnp.where(on, ratio, -jnp.inf)), 1.0),
        "ratio_fraction_high": jnp.sum(high) / denominator,
        "ratio_fraction_low": jnp.sum(low) / denominator,
        "masked_fraction": jnp.sum(masked) / denominator,
        "seq_masked_fraction": jnp.sum(jnp.any(masked, axis=-1)) / jnp.maximum(jnp.sum(rows), 1),
    }
    return ImportanceWeights(
        weights_D_T=weights.astype(jnp.float32),
        metrics={_METRIC_PREFIX + k: v.astype(jnp.float32) for k, v in metrics.items()},
    )


_importance_weights = jax.jit(_importance_weights_impl, static_argnames=("level", "mode"))


def importance_weights(
    sampler_logprobs_D_T: ArrayLike,
    trainer_logprobs_D_T: ArrayLike,
    mask_D_T: ArrayLike,
    *,
    level: MismatchLevel = "sequence",
    mode: MismatchMode = "mask",
    cap: float | ArrayLike = 3.0,
) -> ImportanceWeights:
    """Truncated or masked importance weights between the sampler and the trainer (TIS, MIS).

    The sampler (e.g. vLLM, or Tinker's sampler) and the trainer compute different logprobs
    for the same tokens (kernels, precision, MoE routing), and async data is also stale; the
    policy gradient is then off-policy, and the importance ratio between the two corrects it
    (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
    training"; TRL's `vllm_importance_sampling_*`, verl's and slime's rollout correction).

    With `Δ_t = m_t · (trainer_t − sampler_t)` (`m_t = mask_D_T > 0`, so only masked-in
    tokens count), the log ratio of each token at `level` is

        token:      ℓ_t = Δ_t
        sequence:   ℓ_t = Σ_s Δ_s                (the product of the row's token ratios)
        geometric:  ℓ_t = Σ_s Δ_s / Σ_s m_s      (its per-token mean in log space)

    and with `r_t = exp(ℓ_t)` the weight is, on masked-in tokens,

        truncate:   w_t = min(r_t, cap)                               (TIS)
        mask:       w_t = r_t · 1[1/cap ≤ r_t ≤ cap]                  (MIS)

    so at the sequence and geometric levels `mask` zeroes whole rows. Off the mask `w_t = 1`.
    `cap = inf` with `truncate` gives the raw ratio (truncation is the identity). A
    `sequence` ratio can overflow float32 (to inf) with `truncate` and `cap = inf` only.

    Args:
        sampler_logprobs_D_T: float `[D, T]` logprobs the sampler reported (the batch's
            `logprobs_D_T`).
        trainer_logprobs_D_T: float `[D, T]` the trainer's logprobs of the same targets
            (a `forward` of the policy that sampled, padded like the batch).
        mask_D_T: float/bool `[D, T]`, > 0 on the tokens to correct (action tokens).
        level: `"token"`, `"sequence"` or `"geometric"`; static.
        mode: `"truncate"` or `"mask"`; static.
        cap: the threshold `C >= 1` (TRL's default 3.0); may be traced (no recompile per
            value); a Python number is checked.

    Returns:
        An `ImportanceWeights`: the weights and the metrics, under verl's names
        (`mismatch/rollout_is_` + `mean`, `min`, `max` of the ratio `r` over masked-in tokens
        before truncation or masking, 1.0 without any; `ratio_fraction_high` / `ratio_fraction_low`, the token
        fractions with `r > cap` / `r < 1/cap`, so the fraction `truncate` truncates is
        `ratio_fraction_high`; `masked_fraction`, the token fraction `mask` zeroed (0 with
        `truncate`); `seq_masked_fraction`, the fraction of rows with a masked-in token that
        lost at least one). TRL logs the same ratio as `sampling/importance_sampling_ratio/*`.

    Raises:
        ValueError: `trainer_logprobs_D_T` or `mask_D_T` shaped unlike
            `sampler_logprobs_D_T` (naming both shapes), an input not `[D, T]`, an unknown
            `level` or `mode`, a non-scalar `cap`, or a Python `cap` below 1 or NaN.

    Examples:
        >>> out = importance_weights(jnp.array([[-1.0, -1.0, -2.0]]),
        ...                          jnp.array([[-1.0, 0.0, -2.0]]), jnp.array([[1, 1, 0]]),
        ...                          level="token", mode="truncate", cap=2.0)
        >>> out.weights_D_T.tolist(), float(out.metrics["mismatch/rollout_is_ratio_fraction_high"])
        ([[1.0, 2.0, 1.0]], 0.5)
    """
    name = "importance_weights"
    _check_choice(name, "level", level, get_args(MismatchLevel))
    _check_choice(name, "mode", mode, get_args(MismatchMode))
    check_rank(name, "sampler_logprobs_D_T", sampler_logprobs_D_T, "DT")
    check_shapes_equal(
        name,
        ("sampler_logprobs_D_T", sampler_logprobs_D_T),
        ("trainer_logprobs_D_T", trainer_logprobs_D_T),
        ("mask_D_T", mask_D_T),
    )
    check_rank(name, "cap", cap, "")
    if isinstance(cap, int | float) and not cap >= 1.0:
        raise ValueError(f"{name}: cap must be >= 1 (the interval is [1/cap, cap]), got {cap}")
    weights: ImportanceWeights = _importance_weights(
        sampler_logprobs_D_T, trainer_logprobs_D_T, mask_D_T, cap, level=level, mode=mode
    )
    return weights


@jax.jit
def _overlong_penalty(lengths_D: ArrayLike, max_length: ArrayLike, buffer: ArrayLike) -> jax.Array:
    lengths = jnp.asarray(lengths_D).astype(jnp.float32)
    limit = jnp.asarray(max_length, jnp.float32)
    width = jnp.asarray(buffer, jnp.float32)
    ramp = (limit - width - lengths) / width
    return jnp.clip(ramp, -1.0, 0.0).astype(jnp.float32)


def _check_count(function: str, name: str, value: Any, *, minimum: int) -> None:
    check_rank(function, name, value, "")
    if isinstance(value, bool) or (isinstance(value, int | float) and not value >= minimum):
        raise ValueError(f"{function}: {name} must be a number >= {minimum}, got {value!r}")


def overlong_penalty(
    lengths_D: ArrayLike, *, max_length: int | ArrayLike, buffer: int | ArrayLike
) -> jax.Array:
    """DAPO's soft overlong punishment of each response, by its length.

    With `L = max_length`, `B = buffer` and a response of `|y|` tokens (Yu et al. 2025,
    "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", eq. 13):

        R(y) = 0                        if |y| ≤ L − B
        R(y) = ((L − B) − |y|) / B      if L − B < |y| ≤ L
        R(y) = −1                       if |y| > L

    added to the response's reward (its length is its number of sampled tokens).

    Args:
        lengths_D: int/float `[D]` response lengths.
        max_length: `L` (>= `buffer`); may be traced; a Python number is checked.
        buffer: `B` (>= 1), the soft-punishment interval; may be traced.

    Returns:
        float32 `[D]` penalties in `[-1, 0]`, non-increasing in the length.

    Raises:
        ValueError: `lengths_D` not 1-D; `max_length` or `buffer` not a scalar; a Python
            `buffer < 1` or `max_length < buffer`.

    Examples:
        >>> overlong_penalty(jnp.array([4, 8, 10, 12, 13]), max_length=12, buffer=4).tolist()
        [0.0, 0.0, -0.5, -1.0, -1.0]
    """
    name = "overlong_penalty"
    check_rank(name, "lengths_D", lengths_D, "D")
    _check_count(name, "buffer", buffer, minimum=1)
    _check_count(name, "max_length", max_length, minimum=1)
    if (
        isinstance(max_length, int | float)
        and isinstance(buffer, int | float)
        and max_length < buffer
    ):
        raise ValueError(f"{name}: max_length must be >= buffer ({buffer}), got {max_length}")
    penalty: jax.Array = _overlong_penalty(lengths_D, max_length, buffer)
    return penalty


def _kl_estimate_impl(
    logprobs_D_T: ArrayLike, ref_logprobs_D_T: ArrayLike, mask_D_T: ArrayLike, *, estimator: str
) -> KLEstimate:
    mask = jnp.asarray(mask_D_T)
    on = mask > 0
    # `where` before any arithmetic: garbage off the mask gets neither a value nor a gradient
    logprobs = jnp.where(on, jnp.asarray(logprobs_D_T).astype(jnp.float32), 0.0)
    ref = jnp.where(on, jnp.asarray(ref_logprobs_D_T).astype(jnp.float32), 0.0)
    log_r = ref - logprobs  # log(π_ref / π) on a sample of π
    if estimator == "k1":
        kl = -log_r
    elif estimator == "k2":
        kl = 0.5 * jnp.square(log_r)
    else:
        kl = jnp.expm1(log_r) - log_r
    kl = jnp.where(on, kl, 0.0)
    count = jnp.sum(on)
    return KLEstimate(kl_D_T=kl, mean=jnp.sum(kl) / jnp.maximum(count, 1))


_kl_estimate = jax.jit(_kl_estimate_impl, static_argnames=("estimator",))


def kl_estimate(
    logprobs_D_T: ArrayLike,
    ref_logprobs_D_T: ArrayLike,
    mask_D_T: ArrayLike,
    *,
    estimator: KLEstimator = "k1",
) -> KLEstimate:
    """Schulman's k1, k2, k3 estimators of KL[π ‖ π_ref] from tokens sampled from π.

    With `log r_t = ref_t − logprobs_t` (Schulman 2020, "Approximating KL divergence",
    http://joschu.net/blog/kl-approx.html):

        k1 = −log r              (unbiased, high variance, can be negative)
        k2 = ½ (log r)²          (biased, low variance; ½·E[(log r)²])
        k3 = (r − 1) − log r     (unbiased, low variance, always >= 0)

    per masked-in token, and their batch-wide mean over those tokens. With the sampler's
    logprobs as `logprobs_D_T` and the trainer's as `ref_logprobs_D_T`, k1's mean is the
    cookbook's `optim/kl_sample_train_v1` and k2's its `optim/kl_sample_train_v2`.
    Differentiable in both logprobs (e.g. k3 as a KL loss, as GRPO's). As a penalty on the
    rewards (stop-gradient, `rlpure.kl.kl_penalty_advantages_from_estimate`) only k1 gives an
    unbiased gradient of the KL; k2 and k3 as rewards are biased.

    Args:
        logprobs_D_T: float `[D, T]` logprobs under the sampling policy π.
        ref_logprobs_D_T: float `[D, T]` logprobs of the same targets under π_ref.
        mask_D_T: float/bool `[D, T]`, > 0 on the tokens to measure.
        estimator: `"k1"`, `"k2"` or `"k3"`; static.

    Returns:
        A `KLEstimate` (per-token values and their masked mean).

    Raises:
        ValueError: `ref_logprobs_D_T` or `mask_D_T` shaped unlike `logprobs_D_T` (naming
            both shapes), an input not `[D, T]`, or an unknown `estimator`.

    Examples:
        >>> out = kl_estimate(jnp.array([[-1.0, -2.0]]), jnp.array([[-1.5, -1.0]]),
        ...                   jnp.array([[1.0, 1.0]]), estimator="k1")
        >>> out.kl_D_T.tolist(), float(out.mean)
        ([[0.5, -1.0]], -0.25)
    """
    name = "kl_estimate"
    _check_choice(name, "estimator", estimator, get_args(KLEstimator))
    check_rank(name, "logprobs_D_T", logprobs_D_T, "DT")
    check_shapes_equal(
        name,
        ("logprobs_D_T", logprobs_D_T),
        ("ref_logprobs_D_T", ref_logprobs_D_T),
        ("mask_D_T", mask_D_T),
    )
    estimate: KLEstimate = _kl_estimate(
        logprobs_D_T, ref_logprobs_D_T, mask_D_T, estimator=estimator
    )
    return estimate
