"""Training logprobs of datums grouped by a shared prefix: each prefix computed once, each
datum's suffix attending to it (the split of "Prefix Grouper", 2025).

A GRPO group is one prompt and `G` completions. Here the prompt is a *prefix row* computed
once and each completion a *suffix row* whose queries read the prefix row's keys and values
plus their own causal keys, so attention reads exactly what a datum's token may see (not a
whole packed trie row, as `rlpure.model._prefix_forward` does) and every matmul is a dense
one over all rows at once.

Axes (STYLE's table): P prefix rows (groups), S prefix positions (read as keys by the
suffixes, like a cache), D datum rows (one suffix row each), U suffix positions (a letter of
this module), T datum positions, E model width, V vocabulary, H/N/C heads.

Conventions:
- `GroupedRows` holds one chunk: `prefix_tokens_P_S` (positions `0 … S − 1`), right-padded;
  `suffix_tokens_D_U` with RoPE positions `suffix_positions_D_U` (`prefix_length_D[d] + u`),
  right-padded; `group_D` the prefix row datum `d` continues, and `prefix_length_D` how many
  of its tokens the datum shares (its suffix reads prefix keys `j < prefix_length_D[d]`);
  `gather_D_T` the flat index of datum `d`'s position `t` in the `P · S + D · U` computed
  positions (prefix rows first): `group_D[d] · S + t` for `t < prefix_length_D[d]`, else
  `P · S + d · U + t − prefix_length_D[d]` (any valid index on padding).
- Prefix queries attend causally within their row; suffix query `u` reads the prefix keys
  `j < prefix_length_D[d]` and its own keys `u' ≤ u` (`suffix_attention_mask`). Padding only
  follows real positions, so it is never read; a padded query still reads itself (finite).
- The linear layers (q/k/v/o, MLP, unembedding) run on the prefix and suffix positions
  flattened into one `[1, P · S + D · U]` stream: one large matmul each, not one per route.
- `lp[d, t] = log_softmax(logits[gather[d, t]])[target[d, t]]`; gradients reach a shared
  prefix through its gathered keys and values, and the logits it gives every datum. The
  output equals `rlpure.model.target_logprobs_fn` on the unpacked datums up to float32
  reassociation (masked keys get weight exactly 0).
- Every array is traced, so a new grouping of the same padded shapes reuses the compile.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlpure.model._config import ModelConfig
from rlpure.model._layers import _attend, _dtype, _embed, _finish_block, _qkv, _unembed
from rlpure.model._lora import LoraConfig
from rlpure.model._prefix_forward import _gathered_logprobs
from rlpure.model._transformer import Params, PrefillOutput, _cache_of, _lora_parts

__all__ = [
    "GroupedRows",
    "grouped_target_logprobs_fn",
    "prefill_shared_prefix",
    "suffix_attention_mask",
]


class GroupedRows(NamedTuple):
    """One chunk of datums grouped by shared prefixes (a pytree of int32 arrays, host numpy
    until `jit` takes them; module docstring)."""

    prefix_tokens_P_S: jax.Array | np.ndarray
    suffix_tokens_D_U: jax.Array | np.ndarray
    suffix_positions_D_U: jax.Array | np.ndarray
    group_D: jax.Array | np.ndarray
    prefix_length_D: jax.Array | np.ndarray
    gather_D_T: jax.Array | np.ndarray


def suffix_attention_mask(prefix_length_D: jax.Array, s: int, u: int) -> jax.Array:
    """bool `[D, U, S + U]`: suffix query `i` of row `d` may read prefix key `j < S` iff
    `j < prefix_length_D[d]`, and its own key `S + i'` iff `i' ≤ i`.

    Examples:
        >>> import numpy as np
        >>> np.asarray(suffix_attention_mask(jnp.array([1]), 2, 2)[0]).astype(int).tolist()
        [[1, 0, 1, 0], [1, 0, 1, 1]]
    """
    prefix_D_U_S = jnp.arange(s)[None, None, :] < prefix_length_D[:, None, None]
    prefix_D_U_S = jnp.broadcast_to(prefix_D_U_S, (prefix_length_D.shape[0], u, s))
    own_U_U = jnp.tril(jnp.ones((u, u), bool))
    own_D_U_U = jnp.broadcast_to(own_U_U[None], (prefix_length_D.shape[0], u, u))
    return jnp.concatenate([prefix_D_U_S, own_D_U_U], axis=2)


def _attend_suffix(
    q_D_U_H_C: jax.Array,
    k_P_S_N_C: jax.Array,
    v_P_S_N_C: jax.Array,
    k_D_U_N_C: jax.Array,
    v_D_U_N_C: jax.Array,
    group_D: jax.Array,
    allowed_D_U_X: jax.Array,
    dtype: Any,
) -> jax.Array:
    """Suffix attention over its prefix row's keys and values (gathered by `group_D`) then its
    own (`X = S + U`): float32 `[D, U, H, C]`."""
    k_D_X_N_C = jnp.concatenate([k_P_S_N_C[group_D], k_D_U_N_C], axis=1)
    v_D_X_N_C = jnp.concatenate([v_P_S_N_C[group_D], v_D_U_N_C], axis=1)
    return _attend(q_D_U_H_C, k_D_X_N_C, v_D_X_N_C, allowed_D_U_X, dtype)


# Differentiated, the backward recomputes the gathered keys and values, the scores and the
# softmax (as `_layers._attend_recomputed`), so each layer keeps only its q/k/v.
_attend_suffix_recomputed = jax.checkpoint(_attend_suffix, static_argnums=(7,))
_attend_prefix_recomputed = jax.checkpoint(_attend, static_argnums=(4,))


def _run_grouped_blocks(
    params: Params,
    rows: GroupedRows,
    config: ModelConfig,
    layer_adapters: Params,
    scale: float,
    *,
    keep_kv: bool = False,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
    """Every block over the prefix and suffix positions: the final stream float32
    `[1, P · S + D · U, E]` (prefix positions first) and, with `keep_kv`, every layer's
    RoPE'd keys and values `[L, 1, P · S + D · U, N, C]` (`config.dtype`; else None)."""
    dtype = _dtype(config)
    prefix_tokens_P_S = jnp.asarray(rows.prefix_tokens_P_S)
    suffix_tokens_D_U = jnp.asarray(rows.suffix_tokens_D_U)
    (p, s), (d, u) = prefix_tokens_P_S.shape, suffix_tokens_D_U.shape
    h, c = config.n_heads, config.head_dim
    positions_1_M = jnp.concatenate(
        [
            jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (p, s)).reshape(-1),
            jnp.asarray(rows.suffix_positions_D_U, jnp.int32).reshape(-1),
        ]
    )[None, :]
    tokens_1_M = jnp.concatenate([prefix_tokens_P_S.reshape(-1), suffix_tokens_D_U.reshape(-1)])
    causal_P_S_S = jnp.broadcast_to(jnp.tril(jnp.ones((s, s), bool))[None], (p, s, s))
    allowed_D_U_X = suffix_attention_mask(jnp.asarray(rows.prefix_length_D), s, u)
    group_D = jnp.asarray(rows.group_D)

    def block(
        x_1_M_E: jax.Array, layer_and_adapters: tuple[Params, Params]
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        layer, ad = layer_and_adapters
        q, k, v = _qkv(layer, x_1_M_E, positions_1_M, config, ad, scale)
        k, v = k.astype(dtype), v.astype(dtype)
        n = k.shape[2]
        q_P_S_H_C, q_D_U_H_C = q[0, : p * s].reshape(p, s, h, c), q[0, p * s :].reshape(d, u, h, c)
        k_P_S_N_C, k_D_U_N_C = k[0, : p * s].reshape(p, s, n, c), k[0, p * s :].reshape(d, u, n, c)
        v_P_S_N_C, v_D_U_N_C = v[0, : p * s].reshape(p, s, n, c), v[0, p * s :].reshape(d, u, n, c)
        attn_P_S_H_C = _attend_prefix_recomputed(
            q_P_S_H_C, k_P_S_N_C, v_P_S_N_C, causal_P_S_S, dtype
        )
        attn_D_U_H_C = _attend_suffix_recomputed(
            q_D_U_H_C, k_P_S_N_C, v_P_S_N_C, k_D_U_N_C, v_D_U_N_C, group_D, allowed_D_U_X, dtype
        )
        attn_1_M_H_C = jnp.concatenate(
            [attn_P_S_H_C.reshape(p * s, h, c), attn_D_U_H_C.reshape(d * u, h, c)]
        )[None]
        kept = (k, v) if keep_kv else None
        return _finish_block(layer, x_1_M_E, attn_1_M_H_C, config, ad, scale), kept

    x_1_M_E, kv = jax.lax.scan(
        block, _embed(params, tokens_1_M[None, :]), (params["layers"], layer_adapters)
    )
    return x_1_M_E, kv


def _check_grouped_rows(rows: GroupedRows, target_tokens_D_T: Any) -> None:
    """Raises `ValueError` naming the `GroupedRows` field whose shape disagrees."""
    d, u = rows.suffix_tokens_D_U.shape
    expected = {
        "suffix_positions_D_U": (d, u),
        "group_D": (d,),
        "prefix_length_D": (d,),
        "gather_D_T": tuple(target_tokens_D_T.shape[:2]),
    }
    for name, shape in expected.items():
        got = tuple(getattr(rows, name).shape)
        if got != shape:
            raise ValueError(f"GroupedRows.{name} shape {got} != {shape}")


def grouped_target_logprobs_fn(
    params: Params,
    rows: GroupedRows,
    target_tokens_D_T: jax.Array,
    config: ModelConfig,
    adapters: Params | None = None,
    lora: LoraConfig | None = None,
) -> jax.Array:
    """`rlpure.model.target_logprobs_fn` of the datums grouped in `rows` (not jitted).

    Differentiable in `params` and `adapters`, as `target_logprobs_fn`.

    Args:
        params: the params pytree.
        rows: the chunk (`GroupedRows`: int32 prefix rows `[P, S]`, suffix rows `[D, U]`
            with their positions, `[D]` groups and prefix lengths, `[D, T]` gather indices).
        target_tokens_D_T: int32 `[D, T]` the token each datum position predicts, or
            `[D, T, K]` (`K` targets a position).
        config: the model shape (static in the caller's `jit`).
        adapters: optional LoRA adapters.
        lora: their config (static), required with `adapters`.

    Returns:
        float32 `[D, T]`: `log p(target[d, t] | datum d's tokens[: t + 1])`, computed as
        `logit[target] − logsumexp(logits)` at position `gather_D_T[d, t]` (`[D, T, K]` for
        `[D, T, K]` targets).

    Raises:
        ValueError: a `GroupedRows` field's shape disagrees with the suffix rows or the targets.
    """
    _check_grouped_rows(rows, target_tokens_D_T)
    layer_adapters, top_adapters, scale = _lora_parts(adapters, lora)
    x_1_M_E, _ = _run_grouped_blocks(params, rows, config, layer_adapters, scale)
    logits_M_V = _unembed(params, x_1_M_E, config, top_adapters, scale)[0]
    return _gathered_logprobs(logits_M_V, jnp.asarray(rows.gather_D_T), target_tokens_D_T)


def prefill_shared_prefix(
    params: Params,
    tokens_P_T: jax.Array | np.ndarray,
    length_P: jax.Array | np.ndarray,
    shared: jax.Array | np.ndarray | int,
    *,
    config: ModelConfig,
    cache_len: int,
    prefix_width: int,
    suffix_width: int,
    adapters: Params | None = None,
    lora: LoraConfig | None = None,
) -> PrefillOutput:
    """`rlpure.model.prefill` of prompts that begin with the same `shared` tokens, those
    computed once (not jitted; the sampler's prefill when its prompts share a long prefix).

    The first `prefix_width` (`S`) tokens of prompt 0 are a prefix row, each prompt's tokens
    `[shared, shared + suffix_width)` a suffix row reading the prefix row's keys `j < shared`
    (the grouped layout of this module), and the cache rows are the prefix row's keys and
    values with each prompt's own written from position `shared` on: `S + P · U` positions
    computed instead of `P · T`. The same logits and cache as `prefill` up to rounding (the
    suffix rows' attention sums the same terms in another order: float32 reassociation, and
    with a bfloat16 `config.dtype` a bfloat16 rounding of the keys and values).

    Args:
        params: the params pytree.
        tokens_P_T: int32 `[P, T]` right-padded prompts; the real ones agree on their first
            `shared` tokens (the host's check; a padding prompt's row is garbage, but finite).
        length_P: int32 `[P]` real lengths, each in `[shared + 1, shared + suffix_width]`
            for a real prompt.
        shared: int32 scalar, `1 ≤ shared ≤ prefix_width` (traced: any shared length of the
            same widths reuses the compile; a concrete one is checked).
        config: model shape (static).
        cache_len: `≥ T` (static), as `prefill`'s.
        prefix_width: `S ≤ T` (static).
        suffix_width: `U ≤ T` (static).
        adapters: optional LoRA adapters.
        lora: their config (static).

    Returns:
        `PrefillOutput` as `prefill`'s: logits float32 `[P, V]` after each prompt, and a
        `KVCache` (keys `[P, N, C, cache_len]`, values `[P, N, cache_len, C]`) holding each
        prompt's positions `[0, length_P[p])`.

    Raises:
        ValueError: widths out of range, or a concrete `shared` outside `[1, prefix_width]`.
    """
    tokens_P_T = jnp.asarray(tokens_P_T, jnp.int32)
    (p, t), s, u = tokens_P_T.shape, prefix_width, suffix_width
    if not (1 <= s <= t and 1 <= u <= t <= cache_len):
        raise ValueError(
            f"prefill_shared_prefix: need 1 <= prefix_width {s} <= T {t}, 1 <= suffix_width "
            f"{u} <= T and T <= cache_len {cache_len}"
        )
    if not isinstance(shared, jax.core.Tracer) and not 1 <= int(shared) <= s:
        raise ValueError(f"prefill_shared_prefix: shared {int(shared)} is not in [1, {s}]")
    layer_adapters, top_adapters, scale = _lora_parts(adapters, lora)
    shared = jnp.asarray(shared, jnp.int32)
    # `u` columns of room after the prompts, so that the slice and the write at `shared` are
    # never moved back by XLA's clamping (a move would misplace the suffix against its RoPE
    # positions); what lands past `T` is cut off
    room_P_U = jnp.zeros((p, u), jnp.int32)
    rows = GroupedRows(
        prefix_tokens_P_S=tokens_P_T[:1, :s],
        suffix_tokens_D_U=jax.lax.dynamic_slice_in_dim(
            jnp.concatenate([tokens_P_T, room_P_U], axis=1), shared, u, axis=1
        ),
        suffix_positions_D_U=shared + jnp.broadcast_to(jnp.arange(u, dtype=jnp.int32), (p, u)),
        group_D=jnp.zeros((p,), jnp.int32),
        prefix_length_D=jnp.full((p,), shared),
        gather_D_T=jnp.zeros((p, 1), jnp.int32),  # no targets here
    )
    x_1_M_E, kv = _run_grouped_blocks(params, rows, config, layer_adapters, scale, keep_kv=True)
    assert kv is not None
    offset_P = jnp.clip(jnp.asarray(length_P, jnp.int32) - shared - 1, 0, u - 1)
    x_P_1_E = x_1_M_E[0, s + jnp.arange(p) * u + offset_P][:, None, :]

    def rows_of(kv_1_M_N_C: jax.Array) -> jax.Array:
        """One layer's keys or values as the prompts' `[P, T, N, C]`."""
        n, c = kv_1_M_N_C.shape[2:]
        prefix_1_X_N_C = jnp.pad(kv_1_M_N_C[:, :s], ((0, 0), (0, t + u - s), (0, 0), (0, 0)))
        own_P_U_N_C = kv_1_M_N_C[0, s:].reshape(p, u, n, c)
        base_P_X_N_C = jnp.broadcast_to(prefix_1_X_N_C, (p, t + u, n, c))  # X = T + U
        rows_P_X_N_C = jax.lax.dynamic_update_slice(base_P_X_N_C, own_P_U_N_C, (0, shared, 0, 0))
        return rows_P_X_N_C[:, :t]

    k_L, v_L = kv
    return PrefillOutput(
        logits_B_V=_unembed(params, x_P_1_E, config, top_adapters, scale)[:, 0],
        cache=_cache_of(map(rows_of, k_L), map(rows_of, v_L), cache_len=cache_len),
    )
