"""Decoder-only transformers in pure JAX: parameters, forward pass, KV-cached steps, logprobs.

This is the model behind the local backend (`shell.local`): `rlpure.model._sampling` decodes
from it with a KV cache and `rlpure.model._optimizer` trains it with AdamW; the facade
`rlpure.model` exports all three. Its layers are `rlpure.model._layers`, its LoRA kernels
`rlpure.model._lora_kernels`. It is pure (no IO, no global mutable state, randomness only
through explicit keys) and every entry point is jitted.

Axes (STYLE's table): B rows of a batch, T token positions, S key/value positions (the cache
length), L layers, H query heads, N key/value heads, C head width, E model width,
F feed-forward width, V vocabulary.

Conventions:
- Families (`ModelConfig.family`, see `rlpure.model._config`): token embedding → `n_layers`
  pre-norm blocks (causal self-attention with rotary position embeddings, then an MLP, each
  added to the residual stream) → final norm → unembedding. `"rlpure"`: LayerNorm, GELU MLP
  with biases, untied; `"llama"`: RMSNorm, SwiGLU, no biases; `"qwen2"`: llama plus q/k/v
  biases; `"qwen3"`: llama plus a per-head RMSNorm of queries and keys before RoPE. No dropout.
- Params are a plain pytree (`dict` of arrays in `config.dtype`) whose names carry the axis
  suffixes above; `params["layers"]` is one dict of arrays stacked over a leading layer axis
  `L`, so the blocks run under `jax.lax.scan` (one block compiled, whatever `n_layers`), and
  those names leave that leading `L` implicit (the scan body sees one layer's slice).
  `"rlpure"`: `embed_V_E`, `final_norm_{scale,bias}_E`, `unembed_E_V`; layers
  `attn_norm_{scale,bias}_E`, `wq_E_H_C`, `wk_E_N_C`, `wv_E_N_C`, `wo_H_C_E`,
  `mlp_norm_{scale,bias}_E`, `w_in_E_F`, `b_in_F`, `w_out_F_E`, `b_out_E`. llama/qwen:
  `embed_V_E`, `final_norm_scale_E`, `unembed_E_V` (absent when tied); layers
  `attn_norm_scale_E`, `wq_E_H_C`, `wk_E_N_C`, `wv_E_N_C`, `wo_H_C_E`, (qwen2) `bq_H_C`,
  `bk_N_C`, `bv_N_C`, (qwen3) `q_norm_scale_C`, `k_norm_scale_C`, `mlp_norm_scale_E`,
  `w_gate_E_F`, `w_up_E_F`, `w_down_F_E`. The unembedding is `unembed_E_V` whenever params
  hold one, else the transposed `embed_V_E` (tied).
- Precision: logits and logprobs are float32; the KV cache is kept in `config.dtype`.
- LoRA (`rlpure.model._lora`): every entry point takes optional `adapters` and a static
  `lora` config; gradients with respect to `adapters` never form a full weight gradient.
- Token arrays are `[B, T]` int32, **right-padded**: row `b` is real on `[0, length_b)`.
  Attention is causal, so padding after a position never changes that position's output and
  needs no mask in training; callers mask padded positions out of any reduction.
- Alignment: `logits_B_T_V[b, t]` is the next-token distribution after `tokens[b, : t + 1]`;
  `target_logprobs(params, inputs, targets)[b, t] = log p(targets[b, t] | inputs[b, : t + 1])`
  (Tinker's datum convention: position `i` of the input predicts token `i + 1`).
- Shapes are bucketed by the caller (`rlpure.buckets.bucket_size`, powers of two) so a run
  compiles a handful of times; `config`, `lora` and cache lengths are static under `jit`,
  everything else is traced.
- `prefill` and `decode_step` are the KV-cached pair; `rlpure.model._sampling` decodes with
  `decode_layers` (the step on weights split once per call by `split_layers`) or, when rows
  share prompts, `decode_layers_shared_prompts` (the cache kept in two parts: P prompts'
  positions and each row's M generated ones); `forward` is the full causal pass.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlpure.model._config import ModelConfig
from rlpure.model._layers import (
    _attend_cached,
    _attend_prompt_and_new,
    _attend_recomputed,
    _dtype,
    _embed,
    _finish_block,
    _qkv,
    _unembed,
)
from rlpure.model._lora import LoraConfig

__all__ = [
    "DecodeOutput",
    "ForwardOutput",
    "KVCache",
    "Params",
    "PrefillOutput",
    "count_params",
    "decode_layers",
    "decode_layers_shared_prompts",
    "decode_step",
    "forward",
    "init_params",
    "logits",
    "prefill",
    "split_layers",
    "target_logprobs",
    "target_logprobs_fn",
]

Params = dict[str, Any]


# --- parameters ------------------------------------------------------------------------------


def init_params(key: jax.Array, config: ModelConfig) -> Params:
    """Draws fresh parameters: matrices `N(0, init_std²)`, norm scales 1, biases 0.

    Eager on purpose: under `jit` XLA fuses the normal draw differently and the toy models'
    initial weights would move by an ulp, changing every recorded run from a seed.

    Args:
        key: a JAX PRNG key.
        config: the model shape and family.

    Returns:
        The params pytree (in `config.dtype`; names in the module docstring).
    """
    e, h, n, c = config.d_model, config.n_heads, config.kv_heads, config.head_dim
    f, v = config.d_ff, config.vocab_size
    std = config.init_std
    dtype = _dtype(config)
    keys = jax.random.split(key, 2 + config.n_layers)

    def normal(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        return std * jax.random.normal(key, shape, jnp.float32)

    def ones(*shape: int) -> jax.Array:
        return jnp.ones(shape, jnp.float32)

    def zeros(*shape: int) -> jax.Array:
        return jnp.zeros(shape, jnp.float32)

    def layer(layer_key: jax.Array) -> Params:
        kq, kk, kv, ko, k1, k2, k3 = jax.random.split(layer_key, 7)
        out = {
            "attn_norm_scale_E": ones(e),
            "wq_E_H_C": normal(kq, (e, h, c)),
            "wk_E_N_C": normal(kk, (e, n, c)),
            "wv_E_N_C": normal(kv, (e, n, c)),
            "wo_H_C_E": normal(ko, (h, c, e)),
            "mlp_norm_scale_E": ones(e),
        }
        if config.family == "rlpure":
            out |= {
                "attn_norm_bias_E": zeros(e),
                "mlp_norm_bias_E": zeros(e),
                "w_in_E_F": normal(k1, (e, f)),
                "b_in_F": zeros(f),
                "w_out_F_E": normal(k2, (f, e)),
                "b_out_E": zeros(e),
            }
        else:
            out |= {
                "w_gate_E_F": normal(k1, (e, f)),
                "w_up_E_F": normal(k2, (e, f)),
                "w_down_F_E": normal(k3, (f, e)),
            }
        if config.family == "qwen2":
            out |= {"bq_H_C": zeros(h, c), "bk_N_C": zeros(n, c), "bv_N_C": zeros(n, c)}
        if config.family == "qwen3":
            out |= {"q_norm_scale_C": ones(c), "k_norm_scale_C": ones(c)}
        return out

    per_layer = [layer(layer_key) for layer_key in keys[2:]]
    # Stacked over a leading layer axis `L`; names keep the per-layer suffixes (the scan body
    # sees one layer's slice).
    layers = {name: jnp.stack([p[name] for p in per_layer]) for name in per_layer[0]}
    params: Params = {
        "embed_V_E": normal(keys[0], (v, e)),
        "layers": layers,
        "final_norm_scale_E": ones(e),
    }
    if config.family == "rlpure":
        params["final_norm_bias_E"] = zeros(e)
    if not config.tie_embeddings:
        params["unembed_E_V"] = normal(keys[1], (e, v))
    cast: Params = jax.tree_util.tree_map(lambda x: x.astype(dtype), params)
    return cast


def count_params(params: Params) -> int:
    """Total number of scalars in `params`."""
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))


# --- records ---------------------------------------------------------------------------------


class ForwardOutput(NamedTuple):
    """What `forward` returns: the logits and every layer's (RoPE'd) keys and values."""

    logits_B_T_V: jax.Array  # float32
    k_L_B_T_N_C: jax.Array  # config.dtype
    v_L_B_T_N_C: jax.Array  # config.dtype


class KVCache(NamedTuple):
    """Every layer's RoPE'd keys and values at each cache position (`config.dtype`): tuples
    of `L` arrays, keys `[B, N, C, S]` and values `[B, N, S, C]` (one buffer per layer, in
    the layouts the attention dots read as stored), so a decode step updates and reads each
    layer's cache in place, never slicing or transposing a stack."""

    k_L_B_N_C_S: tuple[jax.Array, ...]
    v_L_B_N_S_C: tuple[jax.Array, ...]


class PrefillOutput(NamedTuple):
    """What `prefill` returns: next-token logits after each prompt, and the filled cache."""

    logits_B_V: jax.Array  # float32, the distribution after tokens[b, : length_b]
    cache: KVCache


class DecodeOutput(NamedTuple):
    """What `decode_step` returns: next-token logits after the fed token, the updated cache."""

    logits_B_V: jax.Array  # float32
    cache: KVCache


def _lora_parts(adapters: Params | None, lora: LoraConfig | None) -> tuple[Params, Params, float]:
    """(per-layer adapters stacked over `L`, top-level adapters, scale); empty without LoRA."""
    if adapters is None:
        return {}, {}, 0.0
    if lora is None:
        raise ValueError("adapters given without their LoraConfig (`lora=`)")
    top = {name: value for name, value in adapters.items() if name != "layers"}
    return dict(adapters.get("layers", {})), top, lora.scale


def _run_blocks(
    params: Params,
    tokens_B_T: jax.Array,
    config: ModelConfig,
    layer_adapters: Params,
    scale: float,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Causal pass over every block: the final stream float32 `[B, T, E]` and the keys and
    values `[L, B, T, N, C]` (`config.dtype`)."""
    b, t = tokens_B_T.shape
    dtype = _dtype(config)
    positions_B_T = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None, :], (b, t))
    causal_T_S = jnp.tril(jnp.ones((t, t), bool))
    allowed_B_T_S = jnp.broadcast_to(causal_T_S[None, :, :], (b, t, t))

    def block(
        x_B_T_E: jax.Array, layer_and_adapters: tuple[Params, Params]
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        layer, ad = layer_and_adapters
        q_B_T_H_C, k_B_T_N_C, v_B_T_N_C = _qkv(layer, x_B_T_E, positions_B_T, config, ad, scale)
        k_B_T_N_C, v_B_T_N_C = k_B_T_N_C.astype(dtype), v_B_T_N_C.astype(dtype)
        attn_B_T_H_C = _attend_recomputed(q_B_T_H_C, k_B_T_N_C, v_B_T_N_C, allowed_B_T_S, dtype)
        x_B_T_E = _finish_block(layer, x_B_T_E, attn_B_T_H_C, config, ad, scale)
        return x_B_T_E, (k_B_T_N_C, v_B_T_N_C)

    x_B_T_E, (k_L_B_T_N_C, v_L_B_T_N_C) = jax.lax.scan(
        block, _embed(params, tokens_B_T), (params["layers"], layer_adapters)
    )
    return x_B_T_E, k_L_B_T_N_C, v_L_B_T_N_C


def forward(
    params: Params,
    tokens_B_T: jax.Array,
    config: ModelConfig,
    *,
    adapters: Params | None = None,
    lora: LoraConfig | None = None,
) -> ForwardOutput:
    """Full causal forward of int32 `tokens_B_T` (not jitted: compose it inside `jit`).

    Args:
        params: the params pytree.
        tokens_B_T: int32 `[B, T]` right-padded tokens.
        config: the model shape (static in the caller's `jit`).
        adapters: optional LoRA adapters (`rlpure.model.init_lora`).
        lora: their config (static), required with `adapters`.

    Returns:
        `ForwardOutput`: logits float32 `[B, T, V]` and the RoPE'd keys and values of every
        layer, `[L, B, T, N, C]` each (what a KV cache holds).
    """
    layer_adapters, top_adapters, scale = _lora_parts(adapters, lora)
    x_B_T_E, k_L_B_T_N_C, v_L_B_T_N_C = _run_blocks(
        params, tokens_B_T, config, layer_adapters, scale
    )
    return ForwardOutput(
        logits_B_T_V=_unembed(params, x_B_T_E, config, top_adapters, scale),
        k_L_B_T_N_C=k_L_B_T_N_C,
        v_L_B_T_N_C=v_L_B_T_N_C,
    )


@partial(jax.jit, static_argnames=("config", "cache_len", "lora"))
def prefill(
    params: Params,
    tokens_B_T: jax.Array,
    length_B: jax.Array,
    *,
    config: ModelConfig,
    cache_len: int,
    adapters: Params | None = None,
    lora: LoraConfig | None = None,
) -> PrefillOutput:
    """Runs the prompts through the model once and fills a KV cache (jitted).

    Only the hidden state at each row's last real position is unembedded (the unembedding of
    a large vocabulary costs as much as several layers).

    Args:
        params: the params pytree.
        tokens_B_T: int32 `[B, T]` right-padded prompts.
        length_B: int32 `[B]` real prompt lengths, each in `[1, T]`.
        config: model shape (static).
        cache_len: `S ≥ T`, the cache length (static): prompt plus room for new tokens.
        adapters: optional LoRA adapters.
        lora: their config (static).

    Returns:
        `PrefillOutput`: logits float32 `[B, V]` after `tokens_B_T[b, : length_B[b]]`, and a
        `KVCache` (per layer: keys `[B, N, C, S]`, values `[B, N, S, C]`) holding positions
        `[0, T)` (zeros after).
    """
    layer_adapters, top_adapters, scale = _lora_parts(adapters, lora)
    tokens_B_T = jnp.asarray(tokens_B_T, jnp.int32)
    b, t = tokens_B_T.shape
    if cache_len < t:
        raise ValueError(f"prefill: cache_len {cache_len} is shorter than the prompts' {t}")
    x_B_T_E, k_L_B_T_N_C, v_L_B_T_N_C = _run_blocks(
        params, tokens_B_T, config, layer_adapters, scale
    )
    last_B = jnp.asarray(length_B, jnp.int32) - 1
    x_B_1_E = x_B_T_E[jnp.arange(b), last_B][:, None, :]
    return PrefillOutput(
        logits_B_V=_unembed(params, x_B_1_E, config, top_adapters, scale)[:, 0],
        cache=_cache_of(k_L_B_T_N_C, v_L_B_T_N_C, cache_len=cache_len),
    )


def _cache_of(
    k_L_B_T_N_C: Iterable[jax.Array], v_L_B_T_N_C: Iterable[jax.Array], *, cache_len: int
) -> KVCache:
    """Each layer's prefilled keys and values `[B, T, N, C]` as a `KVCache` of `cache_len`
    positions (keys `[B, N, C, S]`, values `[B, N, S, C]`, zeros after `T`)."""
    keys_L, values_L = [], []
    for k_B_T_N_C, v_B_T_N_C in zip(k_L_B_T_N_C, v_L_B_T_N_C, strict=True):
        room = cache_len - k_B_T_N_C.shape[1]
        keys_L.append(jnp.pad(k_B_T_N_C.transpose(0, 2, 3, 1), ((0, 0),) * 3 + ((0, room),)))
        values_L.append(
            jnp.pad(v_B_T_N_C.transpose(0, 2, 1, 3), ((0, 0), (0, 0), (0, room), (0, 0)))
        )
    return KVCache(k_L_B_N_C_S=tuple(keys_L), v_L_B_N_S_C=tuple(values_L))


def split_layers(layers: Params, n_layers: int) -> tuple[Params, ...]:
    """The per-layer slices of a pytree stacked over a leading layer axis `L` (`params["layers"]`
    or LoRA adapters' `"layers"`): a tuple of `n_layers` pytrees.

    A decode loop splits once, before it starts: a layer scan over the stacks copied every
    layer's weights out of them at every step (a tenth of a SmolLM2 step).
    """
    return tuple(jax.tree_util.tree_map(lambda x, i=i: x[i], layers) for i in range(n_layers))


def decode_layers(
    params: Params,
    layers_L: tuple[Params, ...],
    cache: KVCache,
    token_B: jax.Array,
    position_B: jax.Array,
    *,
    config: ModelConfig,
    layer_adapters_L: tuple[Params, ...] | None = None,
    adapters: Params | None = None,
    lora: LoraConfig | None = None,
) -> DecodeOutput:
    """`decode_step` on weights already split per layer (`split_layers`), not jitted: the body
    of a decode loop (`rlpure.model._sampling`). The layers are unrolled (one buffer per
    layer, nothing sliced out of a stack); `adapters`' own `"layers"` are ignored in favour of
    `layer_adapters_L`, its per-layer split."""
    _, top_adapters, scale = _lora_parts(adapters, lora)
    dtype = _dtype(config)
    token_B = jnp.asarray(token_B, jnp.int32)
    position_B = jnp.asarray(position_B, jnp.int32)
    rows_B = jnp.arange(token_B.shape[0])
    cache_len = cache.v_L_B_N_S_C[0].shape[2]
    allowed_B_1_S = (jnp.arange(cache_len)[None, :] <= position_B[:, None])[:, None, :]
    positions_B_1 = position_B[:, None]
    k_L, v_L = list(cache.k_L_B_N_C_S), list(cache.v_L_B_N_S_C)
    x_B_1_E = _embed(params, token_B[:, None])
    for index, layer in enumerate(layers_L):
        ad = layer_adapters_L[index] if layer_adapters_L else {}
        q_B_1_H_C, k_B_1_N_C, v_B_1_N_C = _qkv(layer, x_B_1_E, positions_B_1, config, ad, scale)
        # row b's new key at [b, :, :, position_B[b]], its value at [b, :, position_B[b], :]
        # (the advanced indices' axis first: both take [B, N, C])
        k_L[index] = k_L[index].at[rows_B, :, :, position_B].set(k_B_1_N_C[:, 0].astype(dtype))
        v_L[index] = v_L[index].at[rows_B, :, position_B].set(v_B_1_N_C[:, 0].astype(dtype))
        attn_B_1_H_C = _attend_cached(q_B_1_H_C, k_L[index], v_L[index], allowed_B_1_S, dtype)
        x_B_1_E = _finish_block(layer, x_B_1_E, attn_B_1_H_C, config, ad, scale)
    return DecodeOutput(
        logits_B_V=_unembed(params, x_B_1_E, config, top_adapters, scale)[:, 0],
        cache=KVCache(k_L_B_N_C_S=tuple(k_L), v_L_B_N_S_C=tuple(v_L)),
    )


def decode_layers_shared_prompts(
    params: Params,
    layers_L: tuple[Params, ...],
    prompt_cache: KVCache,
    prompt_length_P: jax.Array,
    new_cache: KVCache,
    token_B: jax.Array,
    position_B: jax.Array,
    step: jax.Array,
    *,
    config: ModelConfig,
    layer_adapters_L: tuple[Params, ...] | None = None,
    adapters: Params | None = None,
    lora: LoraConfig | None = None,
) -> DecodeOutput:
    """`decode_layers` on a cache kept in two parts (not jitted; the sampler's loop body):
    `prompt_cache` holds `P` prompts (keys `[P, N, C, S]`, values `[P, N, S, C]`, real on
    `[0, prompt_length_P[p])`), each continued by `Y = B / P` consecutive rows (row `b`
    continues prompt `b // Y`) and never written; `new_cache` holds each row's generated
    tokens (keys `[B, N, C, M]`, values `[B, N, M, C]`, filled on `[0, step)`).

    Feeds `token_B` at `position_B` (its position in the row's sequence, for RoPE), writes its
    keys and values at column `step` of `new_cache` (one column for every row: a slice update,
    where the one-buffer cache scatters each row at its own position) and
    attends to the row's prompt and to columns `≤ step`; each prompt's cache is read once for
    its `Y` rows (`rlpure.model._layers._attend_prompt_and_new`). Returns the logits float32
    `[B, V]` and the updated `new_cache`.
    """
    _, top_adapters, scale = _lora_parts(adapters, lora)
    dtype = _dtype(config)
    token_B = jnp.asarray(token_B, jnp.int32)
    positions_B_1 = jnp.asarray(position_B, jnp.int32)[:, None]
    prompt_len = prompt_cache.v_L_B_N_S_C[0].shape[2]
    new_len = new_cache.v_L_B_N_S_C[0].shape[2]
    allowed_P_S = jnp.arange(prompt_len)[None, :] < jnp.asarray(prompt_length_P)[:, None]
    allowed_B_M = jnp.broadcast_to(jnp.arange(new_len) <= step, (token_B.shape[0], new_len))
    k_L, v_L = list(new_cache.k_L_B_N_C_S), list(new_cache.v_L_B_N_S_C)
    x_B_1_E = _embed(params, token_B[:, None])
    for index, layer in enumerate(layers_L):
        ad = layer_adapters_L[index] if layer_adapters_L else {}
        q_B_1_H_C, k_B_1_N_C, v_B_1_N_C = _qkv(layer, x_B_1_E, positions_B_1, config, ad, scale)
        k_B_N_C_1 = k_B_1_N_C.transpose(0, 2, 3, 1).astype(dtype)
        v_B_N_1_C = v_B_1_N_C.transpose(0, 2, 1, 3).astype(dtype)
        k_L[index] = jax.lax.dynamic_update_slice_in_dim(k_L[index], k_B_N_C_1, step, axis=3)
        v_L[index] = jax.lax.dynamic_update_slice_in_dim(v_L[index], v_B_N_1_C, step, axis=2)
        prompt = (prompt_cache.k_L_B_N_C_S[index], prompt_cache.v_L_B_N_S_C[index], allowed_P_S)
        new = (k_L[index], v_L[index], allowed_B_M)
        attn_B_1_H_C = _attend_prompt_and_new(q_B_1_H_C, prompt, new, dtype)
        x_B_1_E = _finish_block(layer, x_B_1_E, attn_B_1_H_C, config, ad, scale)
    return DecodeOutput(
        logits_B_V=_unembed(params, x_B_1_E, config, top_adapters, scale)[:, 0],
        cache=KVCache(k_L_B_N_C_S=tuple(k_L), v_L_B_N_S_C=tuple(v_L)),
    )


@partial(jax.jit, static_argnames=("config", "lora"))
def decode_step(
    params: Params,
    cache: KVCache,
    token_B: jax.Array,
    position_B: jax.Array,
    *,
    config: ModelConfig,
    adapters: Params | None = None,
    lora: LoraConfig | None = None,
) -> DecodeOutput:
    """Feeds one token per row at its position, attending to the cache (jitted).

    Writes the token's keys and values into the cache at `position_B[b]` (in place inside a
    loop) and attends to cache positions `≤ position_B[b]`.

    Args:
        params: the params pytree.
        cache: the `KVCache` (per layer: keys `[B, N, C, S]`, values `[B, N, S, C]`), filled
            on `[0, position_B[b])` for row `b`.
        token_B: int32 `[B]` the token fed at each row's position.
        position_B: int32 `[B]` each row's position, `< S`.
        config: model shape (static).
        adapters: optional LoRA adapters.
        lora: their config (static).

    Returns:
        `DecodeOutput`: logits float32 `[B, V]` after the fed token, and the updated cache.
    """
    layer_adapters, _, _ = _lora_parts(adapters, lora)
    return decode_layers(
        params,
        split_layers(params["layers"], config.n_layers),
        cache,
        token_B,
        position_B,
        config=config,
        layer_adapters_L=split_layers(layer_adapters, config.n_layers) if layer_adapters else None,
        adapters=adapters,
        lora=lora,
    )


def _logits(
    params: Params,
    tokens_B_T: jax.Array,
    config: ModelConfig,
    adapters: Params | None = None,
    lora: LoraConfig | None = None,
) -> jax.Array:
    layer_adapters, top_adapters, scale = _lora_parts(adapters, lora)
    x_B_T_E, _, _ = _run_blocks(params, tokens_B_T, config, layer_adapters, scale)
    return _unembed(params, x_B_T_E, config, top_adapters, scale)


def target_logprobs_fn(
    params: Params,
    input_tokens_B_T: jax.Array,
    target_tokens_B_T: jax.Array,
    config: ModelConfig,
    adapters: Params | None = None,
    lora: LoraConfig | None = None,
) -> jax.Array:
    """The un-jitted `target_logprobs`, for composing inside other jitted functions.

    Differentiable in `params` and in `adapters`: for LoRA training take the gradient with
    respect to `adapters` only (`jax.vjp(lambda a: target_logprobs_fn(base, i, t, config, a,
    lora), adapters)`), and `base` gets none.

    Args:
        params: the params pytree.
        input_tokens_B_T: int32 `[B, T]` right-padded model inputs.
        target_tokens_B_T: int32 `[B, T]` the token each input position predicts, or
            `[B, T, K]`: `K` target tokens a position (top-K distillation).
        config: the model shape (must be static in the caller's `jit`).
        adapters: optional LoRA adapters.
        lora: their config (static), required with `adapters`.

    Returns:
        float32 `[B, T]`: `log p(target_tokens_B_T[b, t] | input_tokens_B_T[b, : t + 1])`,
        computed as `logit[target] − logsumexp(logits)` (`[B, T, K]` for `[B, T, K]`
        targets).
    """
    logits_B_T_V = _logits(params, input_tokens_B_T, config, adapters, lora)
    top_k = target_tokens_B_T.ndim == 3
    ids_B_T_K = target_tokens_B_T if top_k else target_tokens_B_T[:, :, None]
    picked_B_T_K = jnp.take_along_axis(logits_B_T_V, ids_B_T_K, axis=-1)
    lp_B_T_K = picked_B_T_K - jax.nn.logsumexp(logits_B_T_V, axis=-1)[:, :, None]
    return lp_B_T_K if top_k else lp_B_T_K[:, :, 0]


def _topk_logprobs(
    params: Params, tokens_B_T: jax.Array, k: int, config: ModelConfig
) -> tuple[jax.Array, jax.Array]:
    lp_B_T_V = jax.nn.log_softmax(_logits(params, tokens_B_T, config), axis=-1)
    values_B_T_K, ids_B_T_K = jax.lax.top_k(lp_B_T_V, k)
    return ids_B_T_K.astype(jnp.int32), values_B_T_K


topk_logprobs = jax.jit(_topk_logprobs, static_argnames=("k", "config"))
topk_logprobs.__doc__ = """The `k` most likely next tokens after each position and their
log-probabilities: (int32 ids `[B, T, k]`, float32 logprobs `[B, T, k]`), most likely first,
a tie going to the lower id (`jax.lax.top_k`'s order) (jitted).

`topk_logprobs(params, tokens_B_T, k=, config=)`; `k` (1 to `V`) and `config` are static.
Row `t` is the distribution after `tokens[:, : t + 1]`, as in `logits`; the logprobs are
`log_softmax(logits)`, the values `target_logprobs` gives those ids.
"""


def _ids_logprobs(
    params: Params, tokens_B_T: jax.Array, ids_B_T_K: jax.Array, config: ModelConfig
) -> jax.Array:
    lp_B_T_V = jax.nn.log_softmax(_logits(params, tokens_B_T, config), axis=-1)
    return jnp.take_along_axis(lp_B_T_V, jnp.maximum(ids_B_T_K, 0), axis=-1)


ids_logprobs = jax.jit(_ids_logprobs, static_argnames=("config",))
ids_logprobs.__doc__ = """Log-probabilities of chosen next tokens: float32 `[B, T, K]`,
`log_softmax(logits)[b, t, ids[b, t, k]]` for int32 `ids_B_T_K` (jitted; a negative id reads
token 0, for the caller to discard).

`ids_logprobs(params, tokens_B_T, ids_B_T_K, config=)`; row `t` is the distribution after
`tokens[:, : t + 1]`, as in `logits`. With one id a position, `target_logprobs`' values (to
float32 rounding).
"""

logits = jax.jit(_logits, static_argnames=("config", "lora"))
logits.__doc__ = """Next-token logits, float32 `[B, T, V]`, of int32 `tokens_B_T` (jitted).

`logits(params, tokens_B_T, config=, adapters=None, lora=None)`; `config` and `lora` are
static. Row `t` is the distribution after `tokens[:, : t + 1]`.
"""

target_logprobs = jax.jit(target_logprobs_fn, static_argnames=("config", "lora"))
target_logprobs.__doc__ = """Log-probability of each target token, float32 `[B, T]` (jitted).

`out[b, t] = log softmax(logits(params, input_tokens_B_T)[b, t])[target_tokens_B_T[b, t]]`.
Both token arrays are int32 `[B, T]`; `config` and `lora` are static; `adapters` optional.
Differentiable in `params` and `adapters` (the un-jitted version is what `shell.local`
differentiates inside its own jitted step).
"""
