"""A small decoder-only transformer in pure JAX: config, parameters, forward pass, logprobs.

This is the model behind the local backend (`shell.local`): `rlpure.model` decodes
from it with a KV cache, `rlpure.model` trains it with AdamW, and `rlpure.model` re-exports
all three. It is pure (no IO, no global mutable state, randomness only through explicit keys)
and every entry point is jitted.

Conventions:
- Architecture: token embedding → `n_layers` pre-LayerNorm blocks (causal multi-head
  self-attention with rotary position embeddings (RoPE, Su et al. 2021, arXiv 2104.09864),
  then a GELU MLP, each added to the residual stream) → final LayerNorm → untied unembedding.
  No dropout. All weights are float32.
- Params are a plain pytree (`dict` of `float32` arrays); `params["layers"]` is one dict of
  arrays stacked over a leading layer axis `L`, so the blocks run under `jax.lax.scan` (one
  block compiled, whatever `n_layers`). Array names carry axis suffixes (`V` vocab, `D` model
  width, `H` heads, `K` head width, `F` MLP width); the arrays of `params["layers"]` have one
  more leading axis, the layer, that their names leave implicit. `init_params` draws every
  matrix from `N(0, init_std²)`; norms start at scale 1, bias 0.
- Token arrays are `[B, T]` int32, **right-padded**: row `b` is real on `[0, length_b)`.
  Attention is causal, so padding after a position never changes that position's output and
  needs no mask in training; callers mask padded positions out of any reduction.
- Alignment: `logits_B_T_V[b, t]` is the next-token distribution after `tokens[b, : t + 1]`;
  `target_logprobs(params, inputs, targets)[b, t] = log p(targets[b, t] | inputs[b, : t + 1])`
  (Tinker's datum convention: position `i` of the input predicts token `i + 1`).
- Shapes are bucketed by the caller (`rlpure.buckets.bucket_size`, powers of two) so a run compiles a handful of times;
  `config` is static under `jit`, everything else is traced.
- The building blocks `qkv`, `attend`, `finish_block`, `unembed` and `forward` are public so
  that `rlpure.model` runs the same layers one cached token at a time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp
import msgspec
import numpy as np

from rlpure.model._tokenizer import VOCAB_SIZE

__all__ = [
    "MODEL_CONFIGS",
    "NEG_INF",
    "ModelConfig",
    "Params",
    "attend",
    "count_params",
    "finish_block",
    "forward",
    "get_model_config",
    "init_params",
    "logits",
    "qkv",
    "target_logprobs",
    "target_logprobs_fn",
    "unembed",
]

Params = dict[str, Any]

NEG_INF = -1e30  # finite "minus infinity" for masked attention scores (exp underflows to 0)


class ModelConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Shape and initialisation of the transformer (hashable: static under `jit`).

    Attributes:
        vocab_size: number of token ids `V`.
        d_model: residual width `D`; must be divisible by `n_heads`.
        n_layers: number of transformer blocks.
        n_heads: attention heads `H`; head width `K = d_model // n_heads` must be even (RoPE).
        d_ff: MLP hidden width `F`.
        max_seq_len: longest sequence (prompt + completion) the model accepts.
        init_std: standard deviation of every weight matrix at init. A prototype found 0.1
            (with Adam lr 1e-4–3e-4) works for RL from scratch where 0.02 collapsed.
        rope_base: RoPE frequency base.
        norm_eps: LayerNorm epsilon.
    """

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    max_seq_len: int
    init_std: float = 0.02
    rope_base: float = 10_000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for field in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ModelConfig.{field}: expected a positive int, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"ModelConfig.d_model: {self.d_model} is not divisible by n_heads {self.n_heads}"
            )
        if (self.d_model // self.n_heads) % 2:
            raise ValueError(
                f"ModelConfig: head width d_model / n_heads = {self.d_model // self.n_heads} "
                "must be even for rotary embeddings"
            )
        if not (math.isfinite(self.init_std) and self.init_std > 0):
            raise ValueError(f"ModelConfig.init_std: expected > 0, got {self.init_std}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


MODEL_CONFIGS: Mapping[str, ModelConfig] = MappingProxyType(
    {
        # ~133k params: tests and the offline demo (2 cores, seconds per hundred steps).
        "rlpure/tiny": ModelConfig(
            vocab_size=VOCAB_SIZE,
            d_model=64,
            n_layers=2,
            n_heads=4,
            d_ff=256,
            max_seq_len=2048,
            init_std=0.1,
        ),
        # ~0.9M params: still CPU-friendly, for tasks the tiny model cannot fit.
        "rlpure/small": ModelConfig(
            vocab_size=VOCAB_SIZE,
            d_model=128,
            n_layers=4,
            n_heads=4,
            d_ff=512,
            max_seq_len=2048,
            init_std=0.02,
        ),
    }
)
"""Named model configs, the local backend's `base_model` names."""


def get_model_config(name: str) -> ModelConfig:
    """Looks up a named config (`"rlpure/tiny"`, `"rlpure/small"`).

    Raises:
        ValueError: naming the unknown model and the known ones.
    """
    config = MODEL_CONFIGS.get(name)
    if config is None:
        raise ValueError(f"unknown local model {name!r}; known models: {sorted(MODEL_CONFIGS)}")
    return config


# --- parameters ------------------------------------------------------------------------------


def init_params(key: jax.Array, config: ModelConfig) -> Params:
    """Draws fresh parameters: matrices `N(0, init_std²)`, norm scales 1, biases 0.

    Args:
        key: a JAX PRNG key.
        config: the model shape.

    Returns:
        The params pytree (all float32).
    """
    d, h, k, f, v = config.d_model, config.n_heads, config.head_dim, config.d_ff, config.vocab_size
    std = config.init_std
    keys = jax.random.split(key, 2 + config.n_layers)

    def normal(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        return std * jax.random.normal(key, shape, jnp.float32)

    def layer(layer_key: jax.Array) -> Params:
        kq, kk, kv, ko, ki, kout = jax.random.split(layer_key, 6)
        return {
            "attn_norm_scale_D": jnp.ones((d,), jnp.float32),
            "attn_norm_bias_D": jnp.zeros((d,), jnp.float32),
            "wq_D_H_K": normal(kq, (d, h, k)),
            "wk_D_H_K": normal(kk, (d, h, k)),
            "wv_D_H_K": normal(kv, (d, h, k)),
            "wo_H_K_D": normal(ko, (h, k, d)),
            "mlp_norm_scale_D": jnp.ones((d,), jnp.float32),
            "mlp_norm_bias_D": jnp.zeros((d,), jnp.float32),
            "w_in_D_F": normal(ki, (d, f)),
            "b_in_F": jnp.zeros((f,), jnp.float32),
            "w_out_F_D": normal(kout, (f, d)),
            "b_out_D": jnp.zeros((d,), jnp.float32),
        }

    per_layer = [layer(layer_key) for layer_key in keys[2:]]
    # Stacked over a leading layer axis; names keep the per-layer suffixes (the scan body sees
    # one layer's `[D, H, K]` slice of `wq_D_H_K`, etc.).
    layers = {name: jnp.stack([p[name] for p in per_layer]) for name in per_layer[0]}
    return {
        "embed_V_D": normal(keys[0], (v, d)),
        "layers": layers,
        "final_norm_scale_D": jnp.ones((d,), jnp.float32),
        "final_norm_bias_D": jnp.zeros((d,), jnp.float32),
        "unembed_D_V": normal(keys[1], (d, v)),
    }


def count_params(params: Params) -> int:
    """Total number of scalars in `params`."""
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))


# --- building blocks -------------------------------------------------------------------------


def _layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * scale + bias


def _rope(x_B_T_H_K: jax.Array, positions_B_T: jax.Array, base: float) -> jax.Array:
    """Rotates channel pairs `(i, i + K/2)` by angle `position · base^(−2i/K)`."""
    half = x_B_T_H_K.shape[-1] // 2
    inv_freq_K2 = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles_B_T_K2 = positions_B_T.astype(jnp.float32)[..., None] * inv_freq_K2
    cos = jnp.cos(angles_B_T_K2)[:, :, None, :]
    sin = jnp.sin(angles_B_T_K2)[:, :, None, :]
    x1, x2 = x_B_T_H_K[..., :half], x_B_T_H_K[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def qkv(
    layer: Params, x_B_T_D: jax.Array, positions_B_T: jax.Array, config: ModelConfig
) -> tuple[jax.Array, jax.Array, jax.Array]:
    h = _layer_norm(x_B_T_D, layer["attn_norm_scale_D"], layer["attn_norm_bias_D"], config.norm_eps)
    q = jnp.einsum("btd,dhk->bthk", h, layer["wq_D_H_K"])
    k = jnp.einsum("btd,dhk->bthk", h, layer["wk_D_H_K"])
    v = jnp.einsum("btd,dhk->bthk", h, layer["wv_D_H_K"])
    return _rope(q, positions_B_T, config.rope_base), _rope(k, positions_B_T, config.rope_base), v


def attend(
    q_B_T_H_K: jax.Array, k_B_S_H_K: jax.Array, v_B_S_H_K: jax.Array, allowed_B_T_S: jax.Array
) -> jax.Array:
    scale = 1.0 / math.sqrt(q_B_T_H_K.shape[-1])
    scores = jnp.einsum("bthk,bshk->bhts", q_B_T_H_K, k_B_S_H_K) * scale
    scores = jnp.where(allowed_B_T_S[:, None, :, :], scores, NEG_INF)
    weights = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhts,bshk->bthk", weights, v_B_S_H_K)


def finish_block(
    layer: Params, x_B_T_D: jax.Array, attn_B_T_H_K: jax.Array, config: ModelConfig
) -> jax.Array:
    x = x_B_T_D + jnp.einsum("bthk,hkd->btd", attn_B_T_H_K, layer["wo_H_K_D"])
    h = _layer_norm(x, layer["mlp_norm_scale_D"], layer["mlp_norm_bias_D"], config.norm_eps)
    h = jax.nn.gelu(h @ layer["w_in_D_F"] + layer["b_in_F"])
    return x + h @ layer["w_out_F_D"] + layer["b_out_D"]


def unembed(params: Params, x_B_T_D: jax.Array, config: ModelConfig) -> jax.Array:
    h = _layer_norm(
        x_B_T_D, params["final_norm_scale_D"], params["final_norm_bias_D"], config.norm_eps
    )
    return h @ params["unembed_D_V"]


def forward(
    params: Params, tokens_B_T: jax.Array, config: ModelConfig
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """Full causal forward: logits `[B, T, V]` and RoPE'd keys/values, each `[L, B, T, H, K]`."""
    _, t = tokens_B_T.shape
    positions_B_T = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), tokens_B_T.shape)
    causal_T_T = jnp.tril(jnp.ones((t, t), bool))
    allowed = jnp.broadcast_to(causal_T_T, (tokens_B_T.shape[0], t, t))
    x = params["embed_V_D"][tokens_B_T]

    def block(x: jax.Array, layer: Params) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        q, k, v = qkv(layer, x, positions_B_T, config)
        return finish_block(layer, x, attend(q, k, v, allowed), config), (k, v)

    x, kv = jax.lax.scan(block, x, params["layers"])
    return unembed(params, x, config), kv


def _logits(params: Params, tokens_B_T: jax.Array, config: ModelConfig) -> jax.Array:
    return forward(params, tokens_B_T, config)[0]


def _target_logprobs(
    params: Params, input_tokens_B_T: jax.Array, target_tokens_B_T: jax.Array, config: ModelConfig
) -> jax.Array:
    logprobs_B_T_V = jax.nn.log_softmax(_logits(params, input_tokens_B_T, config), axis=-1)
    return jnp.take_along_axis(logprobs_B_T_V, target_tokens_B_T[..., None], axis=-1)[..., 0]


logits = jax.jit(_logits, static_argnames="config")
logits.__doc__ = """Next-token logits, float32 `[B, T, V]`, of int32 `tokens_B_T` (jitted).

`config` is static. Row `t` is the distribution after `tokens[:, : t + 1]`.
"""

target_logprobs = jax.jit(_target_logprobs, static_argnames="config")
target_logprobs.__doc__ = """Log-probability of each target token, float32 `[B, T]` (jitted).

`out[b, t] = log softmax(logits(params, input_tokens_B_T)[b, t])[target_tokens_B_T[b, t]]`.
Both token arrays are int32 `[B, T]`; `config` is static. Differentiable in `params` (the
un-jitted version is what `shell.local` differentiates inside its own jitted step).
"""

target_logprobs_fn = _target_logprobs
"""The un-jitted `target_logprobs`, for composing inside other jitted functions."""
