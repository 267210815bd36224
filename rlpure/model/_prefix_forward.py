"""Training logprobs of datums packed as prefix tries: each shared prefix computed once.

`rlpure.packing.pack_prefix_tree` lays the datums' token tries out as packed rows in
pre-order; this module runs the transformer of `rlpure.model._transformer` over those rows and
gathers each datum's logprobs back.

Axes (STYLE's table): R packed rows, W positions in a packed row (its padded width), D datums,
T datum positions, E model width, V vocabulary.

Conventions:
- `PrefixRows` holds one chunk: `tokens_R_W`, `positions_R_W` (each node's position in its own
  sequences, for RoPE), `end_R_W` (query `i` of a row may read key `j` iff
  `j ≤ i < end_R_W[r, j]`: `j` is `i` or an ancestor of `i` in the trie) and `gather_D_T`, the
  flat index `r · W + i` of datum `d`'s node at position `t` (any valid index on padding).
- Then `lp[d, t] = log_softmax(logits[gather[d, t]])[target[d, t]]`: the logits are computed
  on the packed rows only (`[R, W, V]`, not `[D, T, V]`); several datums may gather one node
  (a branch point), and their gradients add there. The output equals
  `rlpure.model.target_logprobs_fn` on the unpacked datums up to float32 reassociation
  (masked keys get weight exactly 0).
- Every array is traced, so a new sharing pattern of the same padded shapes reuses the compile.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlpure.model._config import ModelConfig
from rlpure.model._layers import _attend_recomputed, _dtype, _embed, _finish_block, _qkv, _unembed
from rlpure.model._lora import LoraConfig
from rlpure.model._transformer import Params, _lora_parts

__all__ = ["PrefixRows", "prefix_attention_mask", "prefix_target_logprobs_fn"]


class PrefixRows(NamedTuple):
    """One chunk of packed prefix tries (a pytree of int32 arrays, host numpy until `jit` takes
    them; module docstring)."""

    tokens_R_W: jax.Array | np.ndarray
    positions_R_W: jax.Array | np.ndarray
    end_R_W: jax.Array | np.ndarray
    gather_D_T: jax.Array | np.ndarray


def prefix_attention_mask(end_R_W: jax.Array) -> jax.Array:
    """bool `[R, W, W]`: query `i` may read key `j` iff `j ≤ i < end_R_W[r, j]`.

    Examples:
        >>> import numpy as np
        >>> np.asarray(prefix_attention_mask(jnp.array([[3, 2, 3]]))[0]).astype(int).tolist()
        [[1, 0, 0], [1, 1, 0], [1, 0, 1]]
    """
    w = end_R_W.shape[1]
    index_W = jnp.arange(w, dtype=end_R_W.dtype)
    causal_W_W = index_W[None, :] <= index_W[:, None]  # [query i, key j]: j ≤ i
    inside_R_W_W = index_W[None, :, None] < end_R_W[:, None, :]  # i < end_j
    return causal_W_W[None, :, :] & inside_R_W_W


def _run_prefix_blocks(
    params: Params,
    rows: PrefixRows,
    config: ModelConfig,
    layer_adapters: Params,
    scale: float,
) -> jax.Array:
    """Every block over the packed rows under the trie mask: the final stream float32
    `[R, W, E]`."""
    dtype = _dtype(config)
    allowed_R_W_W = prefix_attention_mask(jnp.asarray(rows.end_R_W))
    positions_R_W = jnp.asarray(rows.positions_R_W)

    def block(
        x_R_W_E: jax.Array, layer_and_adapters: tuple[Params, Params]
    ) -> tuple[jax.Array, None]:
        layer, ad = layer_and_adapters
        q, k, v = _qkv(layer, x_R_W_E, positions_R_W, config, ad, scale)
        attn = _attend_recomputed(q, k.astype(dtype), v.astype(dtype), allowed_R_W_W, dtype)
        return _finish_block(layer, x_R_W_E, attn, config, ad, scale), None

    x_R_W_E, _ = jax.lax.scan(
        block, _embed(params, jnp.asarray(rows.tokens_R_W)), (params["layers"], layer_adapters)
    )
    return x_R_W_E


def prefix_target_logprobs_fn(
    params: Params,
    rows: PrefixRows,
    target_tokens_D_T: jax.Array,
    config: ModelConfig,
    adapters: Params | None = None,
    lora: LoraConfig | None = None,
) -> jax.Array:
    """`rlpure.model.target_logprobs_fn` of the datums packed in `rows` (not jitted).

    Differentiable in `params` and `adapters`, as `target_logprobs_fn`.

    Args:
        params: the params pytree.
        rows: the packed chunk (`PrefixRows`: int32 `[R, W]` tokens, positions and subtree
            ends, int32 `[D, T]` flat gather indices into `R · W`).
        target_tokens_D_T: int32 `[D, T]` the token each datum position predicts, or
            `[D, T, K]` (`K` targets a position).
        config: the model shape (static in the caller's `jit`).
        adapters: optional LoRA adapters.
        lora: their config (static), required with `adapters`.

    Returns:
        float32 `[D, T]`: `log p(target[d, t] | datum d's tokens[: t + 1])`, computed as
        `logit[target] − logsumexp(logits)` at node `gather_D_T[d, t]` (`[D, T, K]` for
        `[D, T, K]` targets).

    Raises:
        ValueError: `gather_D_T` and `target_tokens_D_T` differ in shape, or the row arrays do.
    """
    r, w = rows.tokens_R_W.shape
    if rows.positions_R_W.shape != (r, w) or rows.end_R_W.shape != (r, w):
        raise ValueError(
            f"PrefixRows: tokens_R_W {rows.tokens_R_W.shape}, positions_R_W "
            f"{rows.positions_R_W.shape} and end_R_W {rows.end_R_W.shape} must match"
        )
    if rows.gather_D_T.shape != target_tokens_D_T.shape[:2]:
        raise ValueError(
            f"PrefixRows.gather_D_T shape {rows.gather_D_T.shape} != target_tokens_D_T shape "
            f"{target_tokens_D_T.shape[:2]}"
        )
    layer_adapters, top_adapters, scale = _lora_parts(adapters, lora)
    x_R_W_E = _run_prefix_blocks(params, rows, config, layer_adapters, scale)
    logits_R_W_V = _unembed(params, x_R_W_E, config, top_adapters, scale)
    return _gathered_logprobs(
        logits_R_W_V.reshape(r * w, -1), jnp.asarray(rows.gather_D_T), target_tokens_D_T
    )


def _gathered_logprobs(
    logits_N_V: jax.Array, gather_D_T: jax.Array, target_tokens_D_T: jax.Array
) -> jax.Array:
    """float32 `[D, T]`: `logit[target] − logsumexp(logits)` at position `gather_D_T[d, t]` of
    the `N` computed positions (several datums may gather one position; their gradients add
    there); `[D, T, K]` for `[D, T, K]` targets. The logprob read of both packed layouts
    (tries here, `_grouped_forward`'s groups)."""
    lse_N = jax.nn.logsumexp(logits_N_V, axis=-1)
    if target_tokens_D_T.ndim == 3:
        picked_D_T_K = logits_N_V[gather_D_T[:, :, None], target_tokens_D_T]
        return picked_D_T_K - lse_N[gather_D_T][:, :, None]
    picked_D_T = logits_N_V[gather_D_T, target_tokens_D_T]
    return picked_D_T - lse_N[gather_D_T]
