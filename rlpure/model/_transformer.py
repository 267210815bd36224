"""Decoder-only transformers in pure JAX: parameters, forward pass, KV-cached steps, logprobs.

This is the model behind the local backend (`shell.local`): `rlpure.model._sampling` decodes
from it with a KV cache and `rlpure.model._optimizer` trains it with AdamW; the facade
`rlpure.model` exports all three. It is pure (no IO, no global mutable state, randomness only
through explicit keys) and every entry point is jitted.

Axes (STYLE's table; `J`, `G`, `I` and `O` are new here):
    B rows of a batch, T token positions, S key/value positions (`T` in a full forward pass,
    the cache length when decoding), L layers, H query heads, N key/value heads, G query heads
    per key/value head (`H / N`), C head width, E model width, F feed-forward width,
    V vocabulary, R LoRA rank, J rotary frequencies (`C / 2` channel pairs), I and O a LoRA
    target's input and output axes flattened into one (as in `rlpure.model._lora`).

Conventions:
- Families (`ModelConfig.family`, see `rlpure.model._config`): token embedding → `n_layers`
  pre-norm blocks (causal self-attention with rotary position embeddings (RoPE, Su et al.
  2021, arXiv 2104.09864), then an MLP, each added to the residual stream) → final norm →
  unembedding. `"rlpure"`: LayerNorm, GELU MLP with biases, untied; `"llama"`: RMSNorm, SwiGLU,
  no biases; `"qwen2"`: llama plus q/k/v biases; `"qwen3"`: llama plus a per-head RMSNorm of
  queries and keys before RoPE. No dropout. RoPE rotates channel pairs `(j, j + C/2)` (the
  "rotate-half" layout of Hugging Face's Llama/Qwen code) with `inv_freq_j = base^(−2j/C)`,
  optionally rescaled by `RopeScaling` (Llama 3.1). Grouped-query attention: query head `h`
  reads key/value head `h // G` (Hugging Face's `repeat_kv`).
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
- Precision: matrices are multiplied in `config.dtype` with float32 accumulation; the residual
  stream, norms, RoPE, softmax, logits and logprobs are float32. The KV cache is kept in
  `config.dtype`.
- LoRA (`rlpure.model._lora`): every entry point takes optional `adapters` and a static
  `lora` config and computes `x W + (α / R) (x A) B` for each adapted matrix, unmerged, so
  gradients with respect to `adapters` never form a full weight gradient (`_lora_delta`, whose
  VJP is written out for XLA's CPU layouts). The unembedding's adapter is merged into the
  matrix when a call has at least `E` positions (`_adapted_unembed`, whose VJP forms no full
  weight gradient either): that costs fewer multiplies than its term over the vocabulary.
- Token arrays are `[B, T]` int32, **right-padded**: row `b` is real on `[0, length_b)`.
  Attention is causal, so padding after a position never changes that position's output and
  needs no mask in training; callers mask padded positions out of any reduction.
- Alignment: `logits_B_T_V[b, t]` is the next-token distribution after `tokens[b, : t + 1]`;
  `target_logprobs(params, inputs, targets)[b, t] = log p(targets[b, t] | inputs[b, : t + 1])`
  (Tinker's datum convention: position `i` of the input predicts token `i + 1`).
- Shapes are bucketed by the caller (`rlpure.buckets.bucket_size`, powers of two) so a run
  compiles a handful of times; `config`, `lora` and cache lengths are static under `jit`,
  everything else is traced.
- `prefill` and `decode_step` are the KV-cached pair `rlpure.model._sampling` decodes with;
  `forward` is the full causal pass.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlpure.model._config import (
    MODEL_CONFIGS,
    ModelConfig,
    RopeScaling,
    get_model_config,
)
from rlpure.model._lora import LORA_TARGETS, UNEMBED_TARGET, LoraConfig, merged_unembedding

__all__ = [
    "MODEL_CONFIGS",
    "NEG_INF",
    "DecodeOutput",
    "ForwardOutput",
    "KVCache",
    "ModelConfig",
    "Params",
    "PrefillOutput",
    "RopeScaling",
    "count_params",
    "decode_step",
    "forward",
    "get_model_config",
    "init_params",
    "logits",
    "prefill",
    "rope_inv_freq",
    "target_logprobs",
    "target_logprobs_fn",
]

Params = dict[str, Any]

NEG_INF = -1e30  # finite "minus infinity" for masked attention scores (exp underflows to 0)


def _dtype(config: ModelConfig) -> Any:
    return jnp.bfloat16 if config.dtype == "bfloat16" else jnp.float32


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
    """Every layer's RoPE'd keys and values at each cache position (`config.dtype`)."""

    k_L_B_S_N_C: jax.Array
    v_L_B_S_N_C: jax.Array


class PrefillOutput(NamedTuple):
    """What `prefill` returns: next-token logits after each prompt, and the filled cache."""

    logits_B_V: jax.Array  # float32, the distribution after tokens[b, : length_b]
    cache: KVCache


class DecodeOutput(NamedTuple):
    """What `decode_step` returns: next-token logits after the fed token, the updated cache."""

    logits_B_V: jax.Array  # float32
    cache: KVCache


# --- building blocks -------------------------------------------------------------------------


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
    """RoPE inverse frequencies float32 `[J]` (host numpy: a constant of the static config).

    `inv_freq_j = base^(−2j/C)`, then Llama 3.1's rescaling if `config.rope_scaling` is set
    (formula in `rlpure.model._config.RopeScaling`).
    """
    c = config.head_dim
    inv_freq_J = config.rope_base ** (-np.arange(0, c, 2, dtype=np.float64) / c)
    scaling = config.rope_scaling
    if scaling is not None:
        old_len = scaling.original_max_position_embeddings
        low_wavelen = old_len / scaling.low_freq_factor
        high_wavelen = old_len / scaling.high_freq_factor
        wavelen_J = 2 * math.pi / inv_freq_J
        scaled_J = np.where(wavelen_J > low_wavelen, inv_freq_J / scaling.factor, inv_freq_J)
        smooth_J = (old_len / wavelen_J - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        smoothed_J = (1 - smooth_J) * scaled_J / scaling.factor + smooth_J * scaled_J
        medium_J = (wavelen_J >= high_wavelen) & (wavelen_J <= low_wavelen)
        inv_freq_J = np.where(medium_J, smoothed_J, scaled_J)
    return inv_freq_J.astype(np.float32)


def _rope(x_B_T_H_C: jax.Array, positions_B_T: jax.Array, inv_freq_J: np.ndarray) -> jax.Array:
    """Rotates float32 channel pairs `(j, j + C/2)` by angle `position · inv_freq_j`."""
    half = x_B_T_H_C.shape[-1] // 2
    angles_B_T_J = (
        positions_B_T.astype(jnp.float32)[:, :, None] * jnp.asarray(inv_freq_J)[None, None, :]
    )
    cos_B_T_1_J = jnp.cos(angles_B_T_J)[:, :, None, :]
    sin_B_T_1_J = jnp.sin(angles_B_T_J)[:, :, None, :]
    x1, x2 = x_B_T_H_C[..., :half], x_B_T_H_C[..., half:]
    return jnp.concatenate(
        [x1 * cos_B_T_1_J - x2 * sin_B_T_1_J, x2 * cos_B_T_1_J + x1 * sin_B_T_1_J], axis=-1
    )


def _layer_norm(x_B_T_E: jax.Array, scale_E: jax.Array, bias_E: jax.Array, eps: float) -> jax.Array:
    """LayerNorm over the last axis of float32 `x`, with scale and bias."""
    mean_B_T_1 = jnp.mean(x_B_T_E, axis=-1, keepdims=True)
    var_B_T_1 = jnp.mean(jnp.square(x_B_T_E - mean_B_T_1), axis=-1, keepdims=True)
    normed_B_T_E = (x_B_T_E - mean_B_T_1) * jax.lax.rsqrt(var_B_T_1 + eps)
    return (
        normed_B_T_E * scale_E.astype(jnp.float32)[None, None, :]
        + bias_E.astype(jnp.float32)[None, None, :]
    )


def _rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis of float32 `x` (any rank): `x / √(mean(x²) + eps) · scale`."""
    normed = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps)
    return normed * jnp.expand_dims(scale.astype(jnp.float32), tuple(range(x.ndim - 1)))


def _norm(x_B_T_E: jax.Array, owner: Params, prefix: str, config: ModelConfig) -> jax.Array:
    """The family's norm with `owner[prefix + "_scale_E"]` (and `_bias_E` for rlpure)."""
    scale_E = owner[f"{prefix}_scale_E"]
    if config.family == "rlpure":
        return _layer_norm(x_B_T_E, scale_E, owner[f"{prefix}_bias_E"], config.norm_eps)
    return _rms_norm(x_B_T_E, scale_E, config.norm_eps)


def _letters(axes: str) -> str:
    return axes.replace("_", "").lower()


def _linear(
    x: jax.Array,
    weights: Params,
    name: str,
    adapters: Params,
    scale: float,
    dtype: Any,
) -> jax.Array:
    """`x @ weights[name]` (+ its LoRA term if `adapters` holds one), float32 out.

    `x` is `[B, T, *in]`; the target's axis letters (`LORA_TARGETS[name]`) give the einsum.
    """
    target = LORA_TARGETS[name]
    i, o = _letters(target.in_axes), _letters(target.out_axes)
    w = weights[name]
    y = jnp.einsum(
        f"bt{i},{i}{o}->bt{o}", x.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32
    )
    if target.a_name in adapters:
        a, b = adapters[target.a_name], adapters[target.b_name]
        n_in, n_out = math.prod(a.shape[:-1]), math.prod(b.shape[1:])
        bsz, t = x.shape[:2]
        delta_B_T_O = _lora_delta(
            x.astype(jnp.float32).reshape(bsz, t, n_in), a.reshape(n_in, -1), b.reshape(-1, n_out)
        )
        y = y + scale * delta_B_T_O.reshape(y.shape)
    return y


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


def _qkv(
    layer: Params,
    x_B_T_E: jax.Array,
    positions_B_T: jax.Array,
    config: ModelConfig,
    adapters: Params,
    scale: float,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One layer's RoPE'd queries `[B, T, H, C]`, keys and values `[B, T, N, C]` (float32)."""
    dtype = _dtype(config)
    h_B_T_E = _norm(x_B_T_E, layer, "attn_norm", config)
    q_B_T_H_C = _linear(h_B_T_E, layer, "wq_E_H_C", adapters, scale, dtype)
    k_B_T_N_C = _linear(h_B_T_E, layer, "wk_E_N_C", adapters, scale, dtype)
    v_B_T_N_C = _linear(h_B_T_E, layer, "wv_E_N_C", adapters, scale, dtype)
    if config.family == "qwen2":
        q_B_T_H_C = q_B_T_H_C + layer["bq_H_C"].astype(jnp.float32)[None, None, :, :]
        k_B_T_N_C = k_B_T_N_C + layer["bk_N_C"].astype(jnp.float32)[None, None, :, :]
        v_B_T_N_C = v_B_T_N_C + layer["bv_N_C"].astype(jnp.float32)[None, None, :, :]
    if config.family == "qwen3":
        q_B_T_H_C = _rms_norm(q_B_T_H_C, layer["q_norm_scale_C"], config.norm_eps)
        k_B_T_N_C = _rms_norm(k_B_T_N_C, layer["k_norm_scale_C"], config.norm_eps)
    inv_freq_J = rope_inv_freq(config)
    return (
        _rope(q_B_T_H_C, positions_B_T, inv_freq_J),
        _rope(k_B_T_N_C, positions_B_T, inv_freq_J),
        v_B_T_N_C,
    )


def _attend(
    q_B_T_H_C: jax.Array,
    k_B_S_N_C: jax.Array,
    v_B_S_N_C: jax.Array,
    allowed_B_T_S: jax.Array,
    dtype: Any,
) -> jax.Array:
    """Grouped-query softmax attention over the key positions each query is `allowed_B_T_S`.

    Query head `h = n · G + g` attends with key/value head `n`. Returns float32 `[B, T, H, C]`.
    """
    b, t, h, c = q_B_T_H_C.shape
    n = k_B_S_N_C.shape[2]
    q_B_T_N_G_C = q_B_T_H_C.reshape(b, t, n, h // n, c)
    scores_B_N_G_T_S = jnp.einsum(
        "btngc,bsnc->bngts",
        q_B_T_N_G_C.astype(dtype),
        k_B_S_N_C.astype(dtype),
        preferred_element_type=jnp.float32,
    ) * (1.0 / math.sqrt(c))
    scores_B_N_G_T_S = jnp.where(allowed_B_T_S[:, None, None, :, :], scores_B_N_G_T_S, NEG_INF)
    weights_B_N_G_T_S = jax.nn.softmax(scores_B_N_G_T_S, axis=-1)
    out_B_T_N_G_C = jnp.einsum(
        "bngts,bsnc->btngc",
        weights_B_N_G_T_S.astype(dtype),
        v_B_S_N_C.astype(dtype),
        preferred_element_type=jnp.float32,
    )
    return out_B_T_N_G_C.reshape(b, t, h, c)


# `_attend` for the full causal pass: differentiated, its backward recomputes the scores and
# softmax from the queries, keys and values (kept anyway) instead of keeping two `[B, N, G, T,
# T]` arrays per layer, each a zero-filled `[L, ...]` stack under the layer scan (282 MB per
# 8 × 128-token SmolLM2 call). Same gradients bit for bit; in alternating A/Bs of SmolLM2's
# LoRA `forward_backward` 3% and 9% faster (median of 6 and 8 rounds). Undifferentiated, the
# same as `_attend`.
_attend_recomputed = jax.checkpoint(_attend, static_argnums=(4,))


def _finish_block(
    layer: Params,
    x_B_T_E: jax.Array,
    attn_B_T_H_C: jax.Array,
    config: ModelConfig,
    adapters: Params,
    scale: float,
) -> jax.Array:
    """Output projection and residual, then the family's MLP and residual (float32 out)."""
    dtype = _dtype(config)
    x_B_T_E = x_B_T_E + _linear(attn_B_T_H_C, layer, "wo_H_C_E", adapters, scale, dtype)
    h_B_T_E = _norm(x_B_T_E, layer, "mlp_norm", config)
    if config.family == "rlpure":
        pre_B_T_F = _linear(h_B_T_E, layer, "w_in_E_F", adapters, scale, dtype)
        act_B_T_F = jax.nn.gelu(pre_B_T_F + layer["b_in_F"].astype(jnp.float32)[None, None, :])
        out_B_T_E = _linear(act_B_T_F, layer, "w_out_F_E", adapters, scale, dtype)
        bias_E: jax.Array = layer["b_out_E"].astype(jnp.float32)
        return x_B_T_E + out_B_T_E + bias_E[None, None, :]
    gate_B_T_F = _linear(h_B_T_E, layer, "w_gate_E_F", adapters, scale, dtype)
    up_B_T_F = _linear(h_B_T_E, layer, "w_up_E_F", adapters, scale, dtype)
    act_B_T_F = _swiglu(gate_B_T_F, up_B_T_F)
    return x_B_T_E + _linear(act_B_T_F, layer, "w_down_F_E", adapters, scale, dtype)


@jax.custom_vjp
def _swiglu(gate: jax.Array, up: jax.Array) -> jax.Array:
    """SwiGLU's gated activation `silu(gate) · up` (float32, any shape; Shazeer 2020, arXiv
    2002.05202), `silu(g) = g σ(g)`.

    Its VJP is written by hand for memory traffic only: it keeps `gate` and `up` and recomputes
    `σ(gate)` (`∂/∂g = up · σ(g) (1 + g (1 − σ(g)))`, `∂/∂u = silu(g)`), where autodiff kept
    three more `[B, T, F]` arrays per layer; under the layer scan each residual is a
    zero-filled `[L, B, T, F]` stack written every call, and dropping those three made
    SmolLM2's LoRA `forward_backward` ~14% faster (`benchmarks/bench_local_model.py`).
    """
    return _swiglu_forward(gate, up)[0]


def _swiglu_forward(gate: jax.Array, up: jax.Array) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    return jax.nn.silu(gate) * up, (gate, up)


def _swiglu_backward(
    residuals: tuple[jax.Array, ...], d_act: jax.Array
) -> tuple[jax.Array, jax.Array]:
    gate, up = residuals
    sigmoid = jax.nn.sigmoid(gate)
    return d_act * up * sigmoid * (1 + gate * (1 - sigmoid)), d_act * gate * sigmoid


_swiglu.defvjp(_swiglu_forward, _swiglu_backward)


def _unembed(
    params: Params, x_B_T_E: jax.Array, config: ModelConfig, adapters: Params, scale: float
) -> jax.Array:
    """Final norm and unembedding: logits float32 `[B, T, V]` of the stream `x_B_T_E`.

    With an unembedding adapter and at least `E` positions, the adapter is merged into the
    matrix first (`_adapted_unembed`); with fewer (a decode step) its term is added apart,
    whichever costs fewer multiplies (`E V R` to merge, `B T V R` for the term)."""
    dtype = _dtype(config)
    h_B_T_E = _norm(x_B_T_E, params, "final_norm", config)
    tied = "unembed_E_V" not in params
    w = params["embed_V_E"] if tied else params["unembed_E_V"]
    if UNEMBED_TARGET.a_name in adapters:
        a_E_R, b_R_V = adapters[UNEMBED_TARGET.a_name], adapters[UNEMBED_TARGET.b_name]
        if h_B_T_E.shape[0] * h_B_T_E.shape[1] >= config.d_model:
            merged: jax.Array = _adapted_unembed(h_B_T_E, w, a_E_R, b_R_V, scale, tied)
            return merged
        return _unembed_matmul(h_B_T_E, w.astype(dtype), tied) + scale * _lora_delta(
            h_B_T_E, a_E_R, b_R_V
        )
    return _unembed_matmul(h_B_T_E, w.astype(dtype), tied)


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


def _lora_parts(adapters: Params | None, lora: LoraConfig | None) -> tuple[Params, Params, float]:
    """(per-layer adapters stacked over `L`, top-level adapters, scale); empty without LoRA."""
    if adapters is None:
        return {}, {}, 0.0
    if lora is None:
        raise ValueError("adapters given without their LoraConfig (`lora=`)")
    top = {name: value for name, value in adapters.items() if name != "layers"}
    return dict(adapters.get("layers", {})), top, lora.scale


def _embed(params: Params, tokens_B_T: jax.Array) -> jax.Array:
    embed_V_E: jax.Array = params["embed_V_E"]
    return embed_V_E[tokens_B_T].astype(jnp.float32)


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
        `KVCache` `[L, B, S, N, C]` holding positions `[0, T)` (zeros after).
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
    pad = ((0, 0), (0, 0), (0, cache_len - t), (0, 0), (0, 0))
    return PrefillOutput(
        logits_B_V=_unembed(params, x_B_1_E, config, top_adapters, scale)[:, 0],
        cache=KVCache(k_L_B_S_N_C=jnp.pad(k_L_B_T_N_C, pad), v_L_B_S_N_C=jnp.pad(v_L_B_T_N_C, pad)),
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
        cache: the `KVCache` `[L, B, S, N, C]`, filled on `[0, position_B[b])` for row `b`.
        token_B: int32 `[B]` the token fed at each row's position.
        position_B: int32 `[B]` each row's position, `< S`.
        config: model shape (static).
        adapters: optional LoRA adapters.
        lora: their config (static).

    Returns:
        `DecodeOutput`: logits float32 `[B, V]` after the fed token, and the updated cache.
    """
    layer_adapters, top_adapters, scale = _lora_parts(adapters, lora)
    dtype = _dtype(config)
    token_B = jnp.asarray(token_B, jnp.int32)
    position_B = jnp.asarray(position_B, jnp.int32)
    b = token_B.shape[0]
    cache_len = cache.k_L_B_S_N_C.shape[2]
    rows_B = jnp.arange(b)
    allowed_B_1_S = (jnp.arange(cache_len)[None, :] <= position_B[:, None])[:, None, :]
    positions_B_1 = position_B[:, None]

    def block(
        carry: tuple[jax.Array, jax.Array, jax.Array],
        layer_index_and_params: tuple[jax.Array, Params, Params],
    ) -> tuple[tuple[jax.Array, jax.Array, jax.Array], None]:
        x_B_1_E, k_L_B_S_N_C, v_L_B_S_N_C = carry
        index, layer, ad = layer_index_and_params
        q_B_1_H_C, k_B_1_N_C, v_B_1_N_C = _qkv(layer, x_B_1_E, positions_B_1, config, ad, scale)
        k_L_B_S_N_C = k_L_B_S_N_C.at[index, rows_B, position_B].set(k_B_1_N_C[:, 0].astype(dtype))
        v_L_B_S_N_C = v_L_B_S_N_C.at[index, rows_B, position_B].set(v_B_1_N_C[:, 0].astype(dtype))
        attn_B_1_H_C = _attend(
            q_B_1_H_C, k_L_B_S_N_C[index], v_L_B_S_N_C[index], allowed_B_1_S, dtype
        )
        x_B_1_E = _finish_block(layer, x_B_1_E, attn_B_1_H_C, config, ad, scale)
        return (x_B_1_E, k_L_B_S_N_C, v_L_B_S_N_C), None

    x_B_1_E = _embed(params, token_B[:, None])
    (x_B_1_E, k_L_B_S_N_C, v_L_B_S_N_C), _ = jax.lax.scan(
        block,
        (x_B_1_E, cache.k_L_B_S_N_C, cache.v_L_B_S_N_C),
        (jnp.arange(config.n_layers), params["layers"], layer_adapters),
    )
    return DecodeOutput(
        logits_B_V=_unembed(params, x_B_1_E, config, top_adapters, scale)[:, 0],
        cache=KVCache(k_L_B_S_N_C=k_L_B_S_N_C, v_L_B_S_N_C=v_L_B_S_N_C),
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
        target_tokens_B_T: int32 `[B, T]` the token each input position predicts.
        config: the model shape (must be static in the caller's `jit`).
        adapters: optional LoRA adapters.
        lora: their config (static), required with `adapters`.

    Returns:
        float32 `[B, T]`: `log p(target_tokens_B_T[b, t] | input_tokens_B_T[b, : t + 1])`,
        computed as `logit[target] − logsumexp(logits)`.
    """
    logits_B_T_V = _logits(params, input_tokens_B_T, config, adapters, lora)
    picked_B_T = jnp.take_along_axis(logits_B_T_V, target_tokens_B_T[:, :, None], axis=-1)[:, :, 0]
    return picked_B_T - jax.nn.logsumexp(logits_B_T_V, axis=-1)


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
