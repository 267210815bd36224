"""LoRA's differentiated kernels: custom VJPs whose backward passes form no full weight gradient.

Axes (STYLE's table; `I` and `O` are new here): B rows, T token positions, E model width,
V vocabulary, R LoRA rank; `I` and `O` are an adapted matrix's input and output axes flattened
into one (as in `rlpure.model._lora`).

Conventions: `_lora_delta` is the unscaled term `(x A) B` of an adapted layer
`x W + (α / R) (x A) B` (the caller scales it; `rlpure.model._layers._linear`);
`_adapted_unembed` is the unembedding with its adapter merged, `W + (α / R) A B`
(`rlpure.model._lora.merged_unembedding`). Activations and gradients are float32; each
backward pass is the textbook gradient, written by hand for XLA's CPU layouts or memory traffic
(the reason is in each docstring). `_unembed_matmul`, the plain unembedding, lives here because
`_adapted_unembed` multiplies through it.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from rlpure.model._lora import merged_unembedding


def _rank_first(x_B_T_R: jax.Array) -> jax.Array:
    """`x_B_T_R` transposed to `[R, B, T]` and materialised: the barrier keeps XLA from folding
    the transpose back into the dot that reads it (see `_lora_delta`)."""
    moved_R_B_T: jax.Array = jax.lax.optimization_barrier(  # type: ignore[no-untyped-call]
        jnp.moveaxis(x_B_T_R, -1, 0)
    )
    return moved_R_B_T


@jax.custom_vjp
def _lora_delta(x_B_T_I: jax.Array, a_I_R: jax.Array, b_R_O: jax.Array) -> jax.Array:
    """The unscaled LoRA term `(x A) B`, float32 `[B, T, O]`, of float32 `x_B_T_I` (`I`, `O`: a
    target's input and output axes, flattened).

    Its VJP is the textbook one (`dxA = dy Bᵀ`, `dB = (xA)ᵀ dy`, `dA = xᵀ dxA`, `dx = dxA Aᵀ`),
    written by hand for speed only: left to autodiff, XLA's CPU layout assignment serves the
    two token contractions (`dB`, `dA`) by writing the large operand (`dy`, up to `[B, T, F]`)
    transposed, a strided copy that took 15% of SmolLM2's LoRA `forward_backward`
    (`benchmarks/bench_local_model.py`). Here the small operands (`xA`, `dxA`, `[B, T, R]`) are
    the ones transposed, explicitly.
    """
    return _lora_delta_forward(x_B_T_I, a_I_R, b_R_O)[0]


def _lora_delta_forward(
    x_B_T_I: jax.Array, a_I_R: jax.Array, b_R_O: jax.Array
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    xa_B_T_R = jnp.einsum("bti,ir->btr", x_B_T_I, a_I_R)
    return jnp.einsum("btr,ro->bto", xa_B_T_R, b_R_O), (x_B_T_I, a_I_R, b_R_O, xa_B_T_R)


def _lora_delta_backward(
    residuals: tuple[jax.Array, ...], dy_B_T_O: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    x_B_T_I, a_I_R, b_R_O, xa_B_T_R = residuals
    dxa_B_T_R = jnp.einsum("bto,ro->btr", dy_B_T_O, b_R_O)
    db_R_O = jnp.einsum("rbt,bto->ro", _rank_first(xa_B_T_R), dy_B_T_O)
    da_I_R = jnp.einsum("rbt,bti->ri", _rank_first(dxa_B_T_R), x_B_T_I).T
    dx_B_T_I = jnp.einsum("btr,ir->bti", dxa_B_T_R, a_I_R)
    return dx_B_T_I, da_I_R, db_R_O


_lora_delta.defvjp(_lora_delta_forward, _lora_delta_backward)


def _unembed_matmul(h_B_T_E: jax.Array, w: jax.Array, tied: bool) -> jax.Array:
    """Float32 logits of `h_B_T_E` (cast to `w`'s dtype) through `w`: `embed_V_E` when
    `tied` (its transpose is the unembedding), else `unembed_E_V`."""
    spec = "bte,ve->btv" if tied else "bte,ev->btv"
    return jnp.einsum(spec, h_B_T_E.astype(w.dtype), w, preferred_element_type=jnp.float32)


@partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _adapted_unembed(
    h_B_T_E: jax.Array, w: jax.Array, a_E_R: jax.Array, b_R_V: jax.Array, scale: float, tied: bool
) -> jax.Array:
    """Float32 logits of float32 `h_B_T_E` through the unembedding `w` (`embed_V_E` when
    `tied`, else `unembed_E_V`) with its LoRA adapter `(A, B)` merged in first.

    The same function as the base logits plus `scale · _lora_delta(h, A, B)`, computed with
    fewer multiplies when `B T > E` (merging costs `E V R`, the term `B T V R` and a pass over
    the `[B, T, V]` logits to add it), and the logits the sampler (which merges) computes.
    Its VJP is written by hand so no full weight gradient is formed for the adapters:
    `dh = dlogits W'ᵀ` (the merged `W'`), `dB = scale (h A)ᵀ dlogits`, `dA = scale hᵀ (dlogits
    Bᵀ)`, `dW = hᵀ dlogits` (which XLA drops when only the adapters are differentiated).
    """
    return _adapted_unembed_forward(h_B_T_E, w, a_E_R, b_R_V, scale, tied)[0]


def _adapted_unembed_forward(
    h_B_T_E: jax.Array, w: jax.Array, a_E_R: jax.Array, b_R_V: jax.Array, scale: float, tied: bool
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    merged = merged_unembedding(w, a_E_R, b_R_V, scale, tied=tied)
    return _unembed_matmul(h_B_T_E, merged, tied), (h_B_T_E, a_E_R, b_R_V, merged)


def _adapted_unembed_backward(
    scale: float, tied: bool, residuals: tuple[jax.Array, ...], dlogits_B_T_V: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    h_B_T_E, a_E_R, b_R_V, merged = residuals
    dtype = merged.dtype
    dh_B_T_E = jnp.einsum(
        "btv,ve->bte" if tied else "btv,ev->bte",
        dlogits_B_T_V.astype(dtype),
        merged,
        preferred_element_type=jnp.float32,
    )
    dw = jnp.einsum(
        "btv,bte->ve" if tied else "bte,btv->ev",
        *((dlogits_B_T_V, h_B_T_E) if tied else (h_B_T_E, dlogits_B_T_V)),
    ).astype(dtype)
    ha_B_T_R = jnp.einsum("bte,er->btr", h_B_T_E, a_E_R)
    dha_B_T_R = jnp.einsum("btv,rv->btr", dlogits_B_T_V, b_R_V)
    # `btr,btv->rv` with the large operand as it is: for a vocabulary-wide `V` this form
    # runs ~2.5x faster on XLA's CPU than `_lora_delta`'s transposed `[R, B, T]` one.
    db_R_V = scale * jnp.einsum("btr,btv->rv", ha_B_T_R, dlogits_B_T_V)
    da_E_R = scale * jnp.einsum("rbt,bte->re", _rank_first(dha_B_T_R), h_B_T_E).T
    return dh_B_T_E, dw, da_E_R, db_R_V


_adapted_unembed.defvjp(_adapted_unembed_forward, _adapted_unembed_backward)
