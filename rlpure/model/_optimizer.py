"""AdamW for the local backend's transformer, as Tinker's `optim_step(AdamParams)` applies it.

Conventions:
- `init_optimizer_state` / `apply_adam_update` are a pure init/update pair over the params
  pytree of `rlpure.model` (`Params`); the optimiser state is optax's AdamW state, whose
  structure does not depend on the hyper-parameters.
- The hyper-parameters (`AdamHyperparams`) are a registered pytree of traced scalars, so
  changing the learning rate (or any other) between steps never recompiles the jitted step.
- The global gradient norm is taken before clipping and returned with every step.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import msgspec
import optax

from rlpure.model._transformer import Params

__all__ = ["AdamHyperparams", "AdamUpdate", "apply_adam_update", "init_optimizer_state"]


class AdamHyperparams(msgspec.Struct, frozen=True, kw_only=True):
    """Tinker's `AdamParams` as traced scalars (changing them never recompiles).

    AdamW with decoupled weight decay (as `torch.optim.AdamW`), applied after clipping the
    global gradient norm to `grad_clip_norm` (0 disables clipping):
    `g ← g · min(1, c / ‖g‖)`; `m ← β1·m + (1−β1)·g`; `v ← β2·v + (1−β2)·g²`;
    `p ← p − lr·( m̂ / (√v̂ + eps) + wd·p )` with bias-corrected `m̂`, `v̂`.
    """

    learning_rate: float
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


jax.tree_util.register_dataclass(
    AdamHyperparams,
    data_fields=["learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm"],
    meta_fields=[],
)


class AdamUpdate(NamedTuple):
    """What `apply_adam_update` returns.

    Attributes:
        params: the updated params pytree.
        opt_state: the updated AdamW state.
        grad_norm: float32 scalar, the global gradient norm before clipping.
    """

    params: Params
    opt_state: optax.OptState
    grad_norm: jax.Array


def _adamw(hyper: AdamHyperparams) -> optax.GradientTransformation:
    return optax.adamw(
        learning_rate=hyper.learning_rate,
        b1=hyper.beta1,
        b2=hyper.beta2,
        eps=hyper.eps,
        weight_decay=hyper.weight_decay,
    )


def init_optimizer_state(params: Params) -> optax.OptState:
    """Fresh AdamW state for `params` (its structure does not depend on hyper-parameters)."""
    return _adamw(AdamHyperparams(learning_rate=0.0)).init(params)


@jax.jit
def apply_adam_update(
    params: Params, opt_state: optax.OptState, grads: Params, hyper: AdamHyperparams
) -> AdamUpdate:
    """One clipped AdamW step (see `AdamHyperparams`); jitted, hyper-parameters traced.

    Returns:
        `AdamUpdate(params, opt_state, grad_norm)`: the new params and optimiser state, and the
        global gradient norm before clipping.
    """
    grad_norm = optax.tree.norm(grads)
    clip = jnp.asarray(hyper.grad_clip_norm, jnp.float32)
    factor = jnp.where(clip > 0, jnp.minimum(1.0, clip / jnp.maximum(grad_norm, 1e-30)), 1.0)
    grads = jax.tree_util.tree_map(lambda g: g * factor, grads)
    updates, new_state = _adamw(hyper).update(grads, opt_state, params)
    return AdamUpdate(
        params=optax.apply_updates(params, updates), opt_state=new_state, grad_norm=grad_norm
    )
