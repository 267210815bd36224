"""What the Tinker losses share: the `LossOutput` record, input checks, masking and ratio metrics.

Used by `rlpure.losses._functions` (the six losses) and `rlpure.losses._registry` (the registry
and `compute_loss`); see `_functions` for the notation (`lp`, `q`, `A`, `r`).

Conventions:
- Every check takes the Tinker loss name first and puts it at the head of its message
  (`"ppo: input 'advantages' has shape (2, 1), expected (1, 2) ..."`), so an error names the
  loss, the input and both shapes (`rlpure._checks`). Inputs must have the `[D, T]` shape of
  `target_logprobs_D_T` and are cast to its (floating) dtype; they are checked before any
  arithmetic, so a mis-shaped input or mask is refused, never broadcast.
- Hyper-parameters are checked only when they are concrete Python numbers: under `jit` they
  may be traced, and then they pass unchecked.
- `valid_mask_D_T` (bool/float `[D, T]`, nonzero on real positions; `None` = all) becomes a
  bool mask; `rl_inputs` zeroes `lp`, `q` and `A` outside it *before* any arithmetic (the
  "double where" idiom: padding, even NaN/inf, never reaches a value or a gradient) and returns
  them as an `RLInputs` record.
- Action positions are valid positions with `A != 0`; `ratio_metrics` reduces over them only
  (`action_tokens:sum`, `ratio:{mean,min,max}`, `clip_fraction:mean`), giving 1.0 / 0.0 when
  there are none, and `loss_output` adds the stop-gradient'ed `loss:sum`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import msgspec
import numpy as np
from jax.typing import ArrayLike

from rlpure._checks import check_rank, check_shapes_equal

__all__ = [
    "LossOutput",
    "RLInputs",
    "as_input",
    "as_logprobs",
    "check_clip",
    "check_finite",
    "loss_output",
    "ratio_metrics",
    "rl_inputs",
    "valid_mask",
]


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


def as_logprobs(loss: str, target_logprobs_D_T: ArrayLike, *, top_k: bool = False) -> jax.Array:
    """`target_logprobs_D_T` as an array, checked to be floating `[D, T]` (or, with `top_k`,
    `[D, T, K]`: `K` target tokens per position)."""
    if top_k and np.ndim(target_logprobs_D_T) == 3:
        check_rank(loss, "target_logprobs_D_T_K", target_logprobs_D_T, "DTK")
    else:
        check_rank(loss, "target_logprobs_D_T", target_logprobs_D_T, "DT")
    lp = jnp.asarray(target_logprobs_D_T)
    if not jnp.issubdtype(lp.dtype, jnp.floating):
        raise TypeError(f"{loss}: target_logprobs_D_T must be floating, got dtype {lp.dtype}")
    return lp


def as_input(loss: str, field: str, values: ArrayLike, lp: jax.Array) -> jax.Array:
    """Input `field` as an array of `lp`'s dtype, checked to have `lp`'s `[D, T]` shape."""
    check_shapes_equal(loss, ("target_logprobs_D_T", lp), (f"input {field!r}", values))
    return jnp.asarray(values).astype(lp.dtype)


def valid_mask(loss: str, valid_mask_D_T: ArrayLike | None, lp: jax.Array) -> jax.Array:
    """Bool `[D, T]` mask of real positions: `valid_mask_D_T != 0`, all True when `None`.
    With `[D, T, K]` logprobs (`cross_entropy`'s top-K targets) the mask stays `[D, T]` and
    comes back `[D, T, 1]`, to broadcast over `K`."""
    positions = lp if lp.ndim == 2 else lp[..., 0]
    if valid_mask_D_T is None:
        mask = jnp.ones(positions.shape, bool)
    else:
        check_shapes_equal(
            loss, ("target_logprobs_D_T", positions), ("valid_mask_D_T", valid_mask_D_T)
        )
        mask = jnp.asarray(valid_mask_D_T) != 0
    return mask if lp.ndim == 2 else mask[..., None]


def check_finite(loss: str, key: str, value: Any) -> None:
    """Checks a hyper-parameter when it is a concrete number (it may be traced under `jit`)."""
    if isinstance(value, bool):
        raise TypeError(f"{loss}: config {key!r} must be a real number, got bool")
    if isinstance(value, (int, float)) and not math.isfinite(value):
        raise ValueError(f"{loss}: config {key!r} must be finite, got {value}")


def check_clip(loss: str, low: Any, high: Any) -> None:
    """Checks concrete ratio bounds: finite, with `0 <= low <= high`."""
    check_finite(loss, "clip_low_threshold", low)
    check_finite(loss, "clip_high_threshold", high)
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and not 0 <= low <= high:
        raise ValueError(
            f"{loss}: need 0 <= clip_low_threshold <= clip_high_threshold, "
            f"got clip_low_threshold={low}, clip_high_threshold={high}"
        )


def ratio_metrics(
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


def loss_output(loss: jax.Array, lp: jax.Array, metrics: dict[str, jax.Array]) -> LossOutput:
    """`LossOutput` with `metrics` plus the stop-gradient'ed `loss:sum`."""
    return LossOutput(
        loss=loss,
        target_logprobs_D_T=lp,
        metrics={"loss:sum": jax.lax.stop_gradient(loss), **metrics},
    )


class RLInputs(NamedTuple):
    """The checked inputs of an RL loss, zeroed outside the valid mask (what `rl_inputs` returns).

    Attributes:
        lp_D_T: float `[D, T]` learner logprobs as given (what `LossOutput` hands back).
        lp_valid_D_T: `lp`, 0 outside the valid mask.
        q_valid_D_T: sampling logprobs `q` (input `logprobs`), 0 outside the valid mask.
        adv_valid_D_T: advantages `A`, 0 outside the valid mask.
        valid_D_T: bool, True on real (non-padding) positions.
        action_D_T: bool, True on valid positions with `A != 0` (where ratio metrics are taken).
    """

    lp_D_T: jax.Array
    lp_valid_D_T: jax.Array
    q_valid_D_T: jax.Array
    adv_valid_D_T: jax.Array
    valid_D_T: jax.Array
    action_D_T: jax.Array


def rl_inputs(
    loss: str,
    target_logprobs_D_T: ArrayLike,
    sampling_logprobs_D_T: ArrayLike,
    advantages_D_T: ArrayLike,
    valid_mask_D_T: ArrayLike | None,
) -> RLInputs:
    """Checks an RL loss's inputs (named after `loss` in errors) and zeroes them off-mask."""
    lp = as_logprobs(loss, target_logprobs_D_T)
    q = as_input(loss, "logprobs", sampling_logprobs_D_T, lp)
    adv = as_input(loss, "advantages", advantages_D_T, lp)
    valid = valid_mask(loss, valid_mask_D_T, lp)
    adv_valid = jnp.where(valid, adv, 0)
    return RLInputs(
        lp_D_T=lp,
        lp_valid_D_T=jnp.where(valid, lp, 0),
        q_valid_D_T=jnp.where(valid, q, 0),
        adv_valid_D_T=adv_valid,
        valid_D_T=valid,
        action_D_T=valid & (adv_valid != 0),
    )
