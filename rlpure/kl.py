"""KL-to-reference advantage shaping, as tinker-cookbook's `incorporate_kl_penalty` does it.

Conventions:
- Works on the padded `rlpure.packing.DatumBatch`: `[D, T]` arrays aligned with the *targets*
  (position `t` holds the logprob of target token `t`). `ref_logprobs_D_T` must use the same
  alignment: the reference model's logprob of each target token, i.e. the cookbook's
  `compute_logprobs(full_sequence)[1:]`, padded like the batch.
- `mask_D_T` (1.0 on trained action tokens) selects where the penalty is measured. Values of
  `ref_logprobs_D_T` where the mask is 0 are never read (they may be garbage, even NaN).
- The penalty is computed for the **whole batch** at once (one batch-wide average), exactly as
  the cookbook does across all datums of a step.

The shaping, per token with `q` = sampling logprob and `ref` = reference logprob:

    d_t   = (q_t − ref_t) · mask_t                    (0 off the mask)
    avg_d = Σ_{d,t} d_t / Σ_{d,t} mask_t              (batch-wide; `kl_policy_base`)
    x_t   = coef · mask_t · (avg_d − d_t)
    x'_t  = Σ_{k ≥ 0} γ^k · x_{t+k}   within the datum, only when γ > 0
    A_t  ← A_t + x'_t   (or + x_t when γ = 0)

`d` is a one-sample estimate of log(π/π_ref); its batch mean `avg_d` estimates KL[π‖π_ref]
(the cookbook notes the sign as "−KL" of `current‖base` in its docstring; the value is the
mean of `q − ref` either way). Subtracting each token's `d_t` from the batch mean penalises
tokens the policy likes more than the reference does, while keeping the batch-mean shaping zero.

Order of operations (faithful to the cookbook): the mask is applied **before** discounting, so
with γ > 0 an observation position inside a datum (e.g. the prompt of turn 2 in a multi-turn
datum, or the prompt before the first action) receives the discounted KL of the action tokens
after it, and its advantage becomes non-zero. Positions after the datum's last action token —
including all padding — receive nothing. With no action token in the batch the cookbook divides
by zero; here `avg_d` is defined as 0 and nothing is added.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike
from msgspec.structs import replace

from rlpure._checks import check_rank, check_shapes_equal
from rlpure.packing import DatumBatch

__all__ = ["discounted_future_sum", "kl_penalty_advantages", "kl_penalty_advantages_from_estimate"]


@jax.jit
def discounted_future_sum(values_D_T: ArrayLike, discount: ArrayLike) -> jax.Array:
    """Discounted sum of current and future values along the last axis, per row.

    `out_t = Σ_{k=0}^{T-1-t} γ^k · x_{t+k}`, computed right-to-left in one `lax.scan`
    (`running ← x_t + γ·running`), the same recursion as the cookbook's
    `discounted_future_sum_vectorized`, vectorised over rows.

    Args:
        values_D_T: float `[D, T]` values `x`.
        discount: scalar `γ` (may be traced).

    Returns:
        float `[D, T]`, same dtype as `values_D_T`.

    Raises:
        ValueError: `discount` is not a scalar (a `[D]` or `[T]` array would broadcast).

    Examples:
        >>> discounted_future_sum(jnp.array([[1.0, 2.0, 4.0]]), 0.5).tolist()
        [[3.0, 4.0, 4.0]]
    """
    # Shapes are static: this check runs once per trace, before `gamma` could broadcast.
    check_rank("discounted_future_sum", "discount", discount, "")
    values = jnp.asarray(values_D_T)
    gamma = jnp.asarray(discount, values.dtype)

    def step(running_D: jax.Array, x_D: jax.Array) -> tuple[jax.Array, jax.Array]:
        running_D = x_D + gamma * running_D
        return running_D, running_D

    _, out_T_D = jax.lax.scan(
        step, jnp.zeros(values.shape[:-1], values.dtype), jnp.moveaxis(values, -1, 0), reverse=True
    )
    return jnp.moveaxis(out_T_D, 0, -1)


def _check_number(name: str, field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{name}: {field} must be a Python real number (static), got {type(value).__name__}"
        )
    if not math.isfinite(value):
        raise ValueError(f"{name}: {field} must be finite, got {value}")
    return float(value)


def _checked_options(name: str, coef: Any, discount: Any) -> tuple[float, float]:
    """`coef` and `discount` as floats, checked for the shaping functions (errors name `name`)."""
    coef = _check_number(name, "coef", coef)
    discount = _check_number(name, "discount", discount)
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"{name}: discount must lie in [0, 1], got {discount}")
    return coef, discount


def kl_penalty_advantages(
    batch: DatumBatch,
    ref_logprobs_D_T: ArrayLike,
    *,
    coef: float,
    discount: float = 0.0,
) -> tuple[DatumBatch, dict[str, jax.Array]]:
    """Adds the cookbook's KL-to-reference penalty to a batch's advantages.

    See the module docstring for the formula and the order of masking and discounting.

    Args:
        batch: the padded batch (`logprobs_D_T` are the sampling logprobs `q`, `mask_D_T` the
            action mask, `advantages_D_T` the advantages to shape).
        ref_logprobs_D_T: float `[D, T]` reference-model logprobs of the targets, aligned and
            padded like `batch.logprobs_D_T`; ignored where `mask_D_T` is 0.
        coef: penalty coefficient (the cookbook's `kl_penalty_coef`); Python float, static.
        discount: γ in [0, 1] (the cookbook's `kl_discount_factor`); 0 disables discounting.
            Python float, static (it selects the code path).

    Returns:
        A **new** `DatumBatch` (the input is not modified) whose `advantages_D_T` include the
        penalty (float32, or the batch's floating dtype), and metrics
        `{"kl_policy_base": avg_d}` (a float scalar array).

    Raises:
        ValueError: `ref_logprobs_D_T`, or a `[D, T]` field of `batch`, has another shape than
            `batch.logprobs_D_T` (naming both); `discount` outside [0, 1]; non-finite `coef`.

    Examples:
        >>> import numpy as np
        >>> z = np.zeros((1, 3), np.float32)
        >>> batch = DatumBatch(
        ...     input_tokens_D_T=z.astype(np.int32), target_tokens_D_T=z.astype(np.int32),
        ...     logprobs_D_T=np.array([[0.0, -1.0, -1.0]], np.float32), advantages_D_T=z,
        ...     mask_D_T=np.array([[0.0, 1.0, 1.0]], np.float32),
        ...     length_D=np.array([3], np.int32), group_idx_D=np.zeros(1, np.int32),
        ...     traj_idx_D=np.zeros(1, np.int32), num_datums=1)
        >>> shaped, metrics = kl_penalty_advantages(
        ...     batch, np.array([[0.0, -2.0, -1.0]], np.float32), coef=1.0)
        >>> float(metrics["kl_policy_base"]), shaped.advantages_D_T.tolist()
        (0.5, [[0.0, -0.5, 0.5]])
    """
    name = "kl_penalty_advantages"
    coef, discount = _checked_options(name, coef, discount)
    check_rank(name, "batch.logprobs_D_T", batch.logprobs_D_T, "DT")
    check_shapes_equal(
        name,
        ("batch.logprobs_D_T", batch.logprobs_D_T),
        ("ref_logprobs_D_T", ref_logprobs_D_T),
        ("batch.mask_D_T", batch.mask_D_T),
        ("batch.advantages_D_T", batch.advantages_D_T),
        ("batch.input_tokens_D_T", batch.input_tokens_D_T),
    )
    advantages, kl_policy_base = _shaped_advantages(
        batch.logprobs_D_T,
        ref_logprobs_D_T,
        batch.mask_D_T,
        batch.advantages_D_T,
        coef,
        discount=discount,
    )
    return replace(batch, advantages_D_T=advantages), {"kl_policy_base": kl_policy_base}


def _penalty_added(
    kl_D_T: jax.Array,
    mask_D_T: ArrayLike,
    advantages_D_T: ArrayLike,
    coef: ArrayLike,
    discount: float,
) -> tuple[jax.Array, jax.Array]:
    """`A + x'` and `avg_d` from the per-token measure `d` (module docstring), `d` finite."""
    advantages = jnp.asarray(advantages_D_T)
    dtype = advantages.dtype if jnp.issubdtype(advantages.dtype, jnp.floating) else jnp.float32
    advantages = advantages.astype(dtype)
    mask = jnp.asarray(mask_D_T).astype(dtype)
    diff = kl_D_T.astype(dtype) * mask
    total = jnp.sum(mask)
    avg = jnp.where(total > 0, jnp.sum(diff) / jnp.where(total > 0, total, 1), 0)
    added = jnp.asarray(coef, dtype) * mask * (avg - diff)
    if discount > 0:
        added = discounted_future_sum(added, discount)
    return advantages + added, avg


def _shaped_advantages_impl(
    logprobs_D_T: ArrayLike,
    ref_logprobs_D_T: ArrayLike,
    mask_D_T: ArrayLike,
    advantages_D_T: ArrayLike,
    coef: ArrayLike,
    *,
    discount: float,
) -> tuple[jax.Array, jax.Array]:
    advantages = jnp.asarray(advantages_D_T)
    dtype = advantages.dtype if jnp.issubdtype(advantages.dtype, jnp.floating) else jnp.float32
    on = jnp.asarray(mask_D_T) != 0
    q = jnp.where(on, jnp.asarray(logprobs_D_T).astype(dtype), 0)
    ref = jnp.where(on, jnp.asarray(ref_logprobs_D_T).astype(dtype), 0)
    return _penalty_added(q - ref, mask_D_T, advantages_D_T, coef, discount)


_shaped_advantages = jax.jit(_shaped_advantages_impl, static_argnames=("discount",))


def _estimate_shaped_advantages_impl(
    kl_D_T: ArrayLike,
    mask_D_T: ArrayLike,
    advantages_D_T: ArrayLike,
    coef: ArrayLike,
    *,
    discount: float,
) -> tuple[jax.Array, jax.Array]:
    on = jnp.asarray(mask_D_T) != 0
    kl = jnp.where(on, jnp.asarray(kl_D_T), 0)
    return _penalty_added(kl, mask_D_T, advantages_D_T, coef, discount)


_estimate_shaped_advantages = jax.jit(
    _estimate_shaped_advantages_impl, static_argnames=("discount",)
)


def kl_penalty_advantages_from_estimate(
    batch: DatumBatch,
    kl_D_T: ArrayLike,
    *,
    coef: float,
    discount: float = 0.0,
) -> tuple[DatumBatch, dict[str, jax.Array]]:
    """`kl_penalty_advantages` with the per-token measure `d_t` given directly.

    The module docstring's shaping with `d_t = kl_t · mask_t`, e.g. Schulman's k2 or k3 from
    `rlpure.corrections.kl_estimate(q, ref, mask).kl_D_T`. Handing the estimate itself keeps
    its float32 precision; routing it through a reference `ref' = q − k` would not (with
    `q ≈ −10` the spacing of float32 near 10 is ~1e-6, so `q − ref'` loses ~1% of a
    `k ≈ 1e-4`). As reward shaping (a stop-gradient reward) only k1 (`q − ref`, which
    `kl_penalty_advantages` uses) gives an unbiased gradient of the KL; k2 and k3 as rewards
    are biased.

    Args:
        batch: the padded batch (`mask_D_T` the action mask, `advantages_D_T` the advantages
            to shape; `logprobs_D_T` is not read).
        kl_D_T: float `[D, T]` the per-token measure, aligned and padded like the batch;
            ignored where `mask_D_T` is 0.
        coef: penalty coefficient; Python float, static.
        discount: γ in [0, 1]; Python float, static.

    Returns:
        A new `DatumBatch` with shaped advantages and `{"kl_policy_base": avg_d}` (the masked
        mean of `kl_D_T`).

    Raises:
        ValueError: `kl_D_T`, or a `[D, T]` field of `batch`, shaped unlike
            `batch.mask_D_T` (naming both); `discount` outside [0, 1]; non-finite `coef`.

    Examples:
        >>> import numpy as np
        >>> z = np.zeros((1, 3), np.float32)
        >>> batch = DatumBatch(
        ...     input_tokens_D_T=z.astype(np.int32), target_tokens_D_T=z.astype(np.int32),
        ...     logprobs_D_T=z, advantages_D_T=z, mask_D_T=np.array([[0.0, 1.0, 1.0]], np.float32),
        ...     length_D=np.array([3], np.int32), group_idx_D=np.zeros(1, np.int32),
        ...     traj_idx_D=np.zeros(1, np.int32), num_datums=1)
        >>> shaped, metrics = kl_penalty_advantages_from_estimate(
        ...     batch, np.array([[9.0, 1.0, 0.0]], np.float32), coef=1.0)
        >>> float(metrics["kl_policy_base"]), shaped.advantages_D_T.tolist()
        (0.5, [[0.0, -0.5, 0.5]])
    """
    name = "kl_penalty_advantages_from_estimate"
    coef, discount = _checked_options(name, coef, discount)
    check_rank(name, "batch.mask_D_T", batch.mask_D_T, "DT")
    check_shapes_equal(
        name,
        ("batch.mask_D_T", batch.mask_D_T),
        ("kl_D_T", kl_D_T),
        ("batch.advantages_D_T", batch.advantages_D_T),
        ("batch.input_tokens_D_T", batch.input_tokens_D_T),
    )
    advantages, kl_policy_base = _estimate_shaped_advantages(
        kl_D_T, batch.mask_D_T, batch.advantages_D_T, coef, discount=discount
    )
    return replace(batch, advantages_D_T=advantages), {"kl_policy_base": kl_policy_base}
