"""The transformer's layers in pure JAX: norms, RoPE, linear maps with LoRA, attention, MLPs,
the embedding and the unembedding.

Axes (STYLE's table; `J`, `G`, `M` and `Y` are new here): B rows, T token positions, S key/value
positions (`T` in a full pass, the cache length when decoding), H query heads, N key/value heads,
G query heads per key/value head (`H / N`), C head width, E model width, F feed-forward width,
V vocabulary, R LoRA rank, J rotary frequencies (`C / 2` channel pairs); when decoding from a
cache kept in two parts, P distinct prompts, Y rows per prompt (the samples sharing its cache)
and M generated positions.

Conventions:
- A block function reads one layer's params (`layer`: the slice of `params["layers"]` the layer
  scan hands it, names in `rlpure.model._transformer`) and that layer's adapters, scaled by
  `scale = α / R` (zero and empty without LoRA).
- Precision: matrices are multiplied in `config.dtype` with float32 accumulation; the residual
  stream, norms, RoPE, softmax and logits are float32.
- RoPE (Su et al. 2021, arXiv 2104.09864) rotates channel pairs `(j, j + C/2)` (the
  "rotate-half" layout of Hugging Face's Llama/Qwen code) with `inv_freq_j = base^(−2j/C)`,
  optionally rescaled by `RopeScaling` (Llama 3.1). Grouped-query attention: query head `h`
  reads key/value head `h // G` (Hugging Face's `repeat_kv`).
- Masks: `allowed_B_T_S` is True where query position `t` may read key position `s`; the other
  scores become `NEG_INF` before the softmax.
- LoRA is applied unmerged, `x W + (α / R) (x A) B` (`rlpure.model._lora_kernels`), except the
  unembedding's adapter, merged into the matrix when a call has at least `E` positions.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlpure.model._config import ModelConfig
from rlpure.model._lora import LORA_TARGETS, UNEMBED_TARGET, Params
from rlpure.model._lora_kernels import _adapted_unembed, _lora_delta, _unembed_matmul

__all__ = ["NEG_INF", "rope_inv_freq"]

NEG_INF = -1e30  # finite "minus infinity" for masked attention scores (exp underflows to 0)


def _dtype(config: ModelConfig) -> Any:
    return jnp.bfloat16 if config.dtype == "bfloat16" else jnp.float32


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


def _attend_cached(
    q_B_T_H_C: jax.Array,
    k_B_N_C_S: jax.Array,
    v_B_N_S_C: jax.Array,
    allowed_B_T_S: jax.Array,
    dtype: Any,
) -> jax.Array:
    """`_attend` over one layer of a KV cache laid out for the decode step: keys `[B, N, C,
    S]`, values `[B, N, S, C]`.

    The same attention as `_attend` (the same scores bit for bit); in these layouts both
    contractions read the cache as it is stored. With `[B, S, N, C]` XLA's CPU backend
    transposed each layer's keys and values before its dots, every decode step (a quarter of
    the step's time), and with keys `[B, N, S, C]` the score dot ran 2-5× slower.
    Returns float32 `[B, T, H, C]`.
    """
    b, t, h, c = q_B_T_H_C.shape
    n = k_B_N_C_S.shape[1]
    q_B_N_G_T_C = q_B_T_H_C.reshape(b, t, n, h // n, c).transpose(0, 2, 3, 1, 4)
    scores_B_N_G_T_S = jnp.einsum(
        "bngtc,bncs->bngts",
        q_B_N_G_T_C.astype(dtype),
        k_B_N_C_S.astype(dtype),
        preferred_element_type=jnp.float32,
    ) * (1.0 / math.sqrt(c))
    scores_B_N_G_T_S = jnp.where(allowed_B_T_S[:, None, None, :, :], scores_B_N_G_T_S, NEG_INF)
    weights_B_N_G_T_S = jax.nn.softmax(scores_B_N_G_T_S, axis=-1)
    out_B_N_G_T_C = jnp.einsum(
        "bngts,bnsc->bngtc",
        weights_B_N_G_T_S.astype(dtype),
        v_B_N_S_C.astype(dtype),
        preferred_element_type=jnp.float32,
    )
    return out_B_N_G_T_C.transpose(0, 3, 1, 2, 4).reshape(b, t, h, c)


def _attend_prompt_and_new(
    q_B_1_H_C: jax.Array,
    prompt: tuple[jax.Array, jax.Array, jax.Array],
    new: tuple[jax.Array, jax.Array, jax.Array],
    dtype: Any,
) -> jax.Array:
    """One decode step's attention over a cache kept in two parts: `P` prompts' keys and
    values, each read once for the `Y = B / P` rows that continue it, and every row's own
    generated tokens'.

    `prompt` is `(k_P_N_C_S, v_P_N_S_C, allowed_P_S)` with row `b` continuing prompt
    `b // Y`; `new` is `(k_B_N_C_M, v_B_N_M_C, allowed_B_M)`. The softmax runs over both
    parts' scores together: the same attention as `_attend_cached` over their concatenation
    (one maximum, one normaliser; only the normaliser's summation order differs). Reading each
    prompt's cache once per prompt, not once per row, is the point: a GRPO batch decodes `Y`
    samples of each prompt. Returns float32 `[B, 1, H, C]`.
    """
    k_P_N_C_S, v_P_N_S_C, allowed_P_S = prompt
    k_B_N_C_M, v_B_N_M_C, allowed_B_M = new
    b, _, h, c = q_B_1_H_C.shape
    p, n = k_P_N_C_S.shape[:2]
    y, g = b // p, h // n
    scale = 1.0 / math.sqrt(c)
    q_P_Y_N_G_C = q_B_1_H_C.reshape(p, y, n, g, c).astype(dtype)
    prompt_P_Y_N_G_S = (
        jnp.einsum(
            "pyngc,pncs->pyngs",
            q_P_Y_N_G_C,
            k_P_N_C_S.astype(dtype),
            preferred_element_type=jnp.float32,
        )
        * scale
    )
    prompt_P_Y_N_G_S = jnp.where(allowed_P_S[:, None, None, None, :], prompt_P_Y_N_G_S, NEG_INF)
    new_B_N_G_M = (
        jnp.einsum(
            "bngc,bncm->bngm",
            q_P_Y_N_G_C.reshape(b, n, g, c),
            k_B_N_C_M.astype(dtype),
            preferred_element_type=jnp.float32,
        )
        * scale
    )
    new_B_N_G_M = jnp.where(allowed_B_M[:, None, None, :], new_B_N_G_M, NEG_INF)
    prompt_B_N_G_S = prompt_P_Y_N_G_S.reshape(b, n, g, -1)
    top_B_N_G_1 = jnp.maximum(
        jnp.max(prompt_B_N_G_S, axis=-1, keepdims=True),
        jnp.max(new_B_N_G_M, axis=-1, keepdims=True),
    )
    exp_prompt_B_N_G_S = jnp.exp(prompt_B_N_G_S - top_B_N_G_1)
    exp_new_B_N_G_M = jnp.exp(new_B_N_G_M - top_B_N_G_1)
    total_B_N_G_1 = jnp.sum(exp_prompt_B_N_G_S, axis=-1, keepdims=True) + jnp.sum(
        exp_new_B_N_G_M, axis=-1, keepdims=True
    )
    out_P_Y_N_G_C = jnp.einsum(
        "pyngs,pnsc->pyngc",
        (exp_prompt_B_N_G_S / total_B_N_G_1).reshape(p, y, n, g, -1).astype(dtype),
        v_P_N_S_C.astype(dtype),
        preferred_element_type=jnp.float32,
    )
    out_B_N_G_C = jnp.einsum(
        "bngm,bnmc->bngc",
        (exp_new_B_N_G_M / total_B_N_G_1).astype(dtype),
        v_B_N_M_C.astype(dtype),
        preferred_element_type=jnp.float32,
    )
    return (out_P_Y_N_G_C.reshape(b, n, g, c) + out_B_N_G_C).reshape(b, 1, h, c)


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


def _embed(params: Params, tokens_B_T: jax.Array) -> jax.Array:
    embed_V_E: jax.Array = params["embed_V_E"]
    return embed_V_E[tokens_B_T].astype(jnp.float32)


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
