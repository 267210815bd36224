"""A small decoder-only transformer in pure JAX: config, parameters, forward pass, logprobs.

This is the model behind the local backend (`shell.local`): `rlpure.model._sampling` decodes
from it with a KV cache and `rlpure.model._optimizer` trains it with AdamW; the facade
`rlpure.model` exports all three. It is pure (no IO, no global mutable state, randomness only
through explicit keys) and every entry point is jitted.

Axes (STYLE's table; `J` is new here):
    B rows of a batch, T token positions, S key/value positions (`T` in a full forward pass,
    the cache length when decoding), L layers, H query heads, N key/value heads, C head width,
    E model width, F feed-forward width, V vocabulary, J rotary frequencies (`C / 2` channel
    pairs). This model has no grouped-query attention: `N = H`, and attention pairs query head
    `h` with key/value head `h`.

Conventions:
- Architecture: token embedding → `n_layers` pre-LayerNorm blocks (causal multi-head
  self-attention with rotary position embeddings (RoPE, Su et al. 2021, arXiv 2104.09864),
  then a GELU MLP, each added to the residual stream) → final LayerNorm → untied unembedding.
  No dropout. All weights are float32.
- Params are a plain pytree (`dict` of `float32` arrays) whose names carry the axis suffixes
  above; `params["layers"]` is one dict of arrays stacked over a leading layer axis `L`, so the
  blocks run under `jax.lax.scan` (one block compiled, whatever `n_layers`), and those names
  leave that leading `L` implicit (the scan body sees one layer's slice). `init_params` draws
  every matrix from `N(0, init_std²)`; norms start at scale 1, bias 0.
- Token arrays are `[B, T]` int32, **right-padded**: row `b` is real on `[0, length_b)`.
  Attention is causal, so padding after a position never changes that position's output and
  needs no mask in training; callers mask padded positions out of any reduction.
- Alignment: `logits_B_T_V[b, t]` is the next-token distribution after `tokens[b, : t + 1]`;
  `target_logprobs(params, inputs, targets)[b, t] = log p(targets[b, t] | inputs[b, : t + 1])`
  (Tinker's datum convention: position `i` of the input predicts token `i + 1`).
- Shapes are bucketed by the caller (`rlpure.buckets.bucket_size`, powers of two) so a run
  compiles a handful of times; `config` is static under `jit`, everything else is traced.
- The building blocks `qkv`, `attend`, `finish_block`, `unembed` and `forward` are public so
  that `rlpure.model._sampling` runs the same layers one cached token at a time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import msgspec
import numpy as np

from rlpure.model._tokenizer import VOCAB_SIZE

__all__ = [
    "MODEL_CONFIGS",
    "NEG_INF",
    "AttentionInputs",
    "ForwardOutput",
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
        d_model: model (residual) width `E`; must be divisible by `n_heads`.
        n_layers: number of transformer blocks `L`.
        n_heads: attention heads `H` (queries; keys and values have as many, `N = H`); head
            width `C = d_model // n_heads` must be even (RoPE).
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
        """Head width `C = d_model // n_heads`."""
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
    e, h, c, f, v = config.d_model, config.n_heads, config.head_dim, config.d_ff, config.vocab_size
    n = h  # key/value heads: no grouped-query attention
    std = config.init_std
    keys = jax.random.split(key, 2 + config.n_layers)

    def normal(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        return std * jax.random.normal(key, shape, jnp.float32)

    def layer(layer_key: jax.Array) -> Params:
        kq, kk, kv, ko, ki, kout = jax.random.split(layer_key, 6)
        return {
            "attn_norm_scale_E": jnp.ones((e,), jnp.float32),
            "attn_norm_bias_E": jnp.zeros((e,), jnp.float32),
            "wq_E_H_C": normal(kq, (e, h, c)),
            "wk_E_N_C": normal(kk, (e, n, c)),
            "wv_E_N_C": normal(kv, (e, n, c)),
            "wo_H_C_E": normal(ko, (h, c, e)),
            "mlp_norm_scale_E": jnp.ones((e,), jnp.float32),
            "mlp_norm_bias_E": jnp.zeros((e,), jnp.float32),
            "w_in_E_F": normal(ki, (e, f)),
            "b_in_F": jnp.zeros((f,), jnp.float32),
            "w_out_F_E": normal(kout, (f, e)),
            "b_out_E": jnp.zeros((e,), jnp.float32),
        }

    per_layer = [layer(layer_key) for layer_key in keys[2:]]
    # Stacked over a leading layer axis `L`; names keep the per-layer suffixes (the scan body
    # sees one layer's slice).
    layers = {name: jnp.stack([p[name] for p in per_layer]) for name in per_layer[0]}
    return {
        "embed_V_E": normal(keys[0], (v, e)),
        "layers": layers,
        "final_norm_scale_E": jnp.ones((e,), jnp.float32),
        "final_norm_bias_E": jnp.zeros((e,), jnp.float32),
        "unembed_E_V": normal(keys[1], (e, v)),
    }


def count_params(params: Params) -> int:
    """Total number of scalars in `params`."""
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))


# --- building blocks -------------------------------------------------------------------------


class AttentionInputs(NamedTuple):
    """What `qkv` returns: RoPE'd queries and keys, and values, of one layer."""

    q_B_T_H_C: jax.Array
    k_B_T_N_C: jax.Array
    v_B_T_N_C: jax.Array


class ForwardOutput(NamedTuple):
    """What `forward` returns: the logits and every layer's (RoPE'd) keys and values."""

    logits_B_T_V: jax.Array
    k_L_B_T_N_C: jax.Array
    v_L_B_T_N_C: jax.Array


def _layer_norm(x_B_T_E: jax.Array, scale_E: jax.Array, bias_E: jax.Array, eps: float) -> jax.Array:
    """LayerNorm over the model width of float32 `[B, T, E]`, with `[E]` scale and bias."""
    mean_B_T_1 = jnp.mean(x_B_T_E, axis=-1, keepdims=True)
    var_B_T_1 = jnp.mean(jnp.square(x_B_T_E - mean_B_T_1), axis=-1, keepdims=True)
    normed_B_T_E = (x_B_T_E - mean_B_T_1) * jax.lax.rsqrt(var_B_T_1 + eps)
    return normed_B_T_E * scale_E[None, None, :] + bias_E[None, None, :]


def _rope(x_B_T_H_C: jax.Array, positions_B_T: jax.Array, base: float) -> jax.Array:
    """Rotates channel pairs `(j, j + C/2)` by angle `position · base^(−2j/C)`."""
    half = x_B_T_H_C.shape[-1] // 2
    inv_freq_J = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles_B_T_J = positions_B_T.astype(jnp.float32)[:, :, None] * inv_freq_J[None, None, :]
    cos_B_T_1_J = jnp.cos(angles_B_T_J)[:, :, None, :]
    sin_B_T_1_J = jnp.sin(angles_B_T_J)[:, :, None, :]
    x1, x2 = x_B_T_H_C[..., :half], x_B_T_H_C[..., half:]
    return jnp.concatenate(
        [x1 * cos_B_T_1_J - x2 * sin_B_T_1_J, x1 * sin_B_T_1_J + x2 * cos_B_T_1_J], axis=-1
    )


def qkv(
    layer: Params, x_B_T_E: jax.Array, positions_B_T: jax.Array, config: ModelConfig
) -> AttentionInputs:
    """One layer's attention inputs for the residual stream `x_B_T_E` (float32 `[B, T, E]`).

    Normalises `x_B_T_E`, projects it to queries `[B, T, H, C]` and keys and values
    `[B, T, N, C]`, and rotates queries and keys by their int32 `positions_B_T`.
    """
    h_B_T_E = _layer_norm(
        x_B_T_E, layer["attn_norm_scale_E"], layer["attn_norm_bias_E"], config.norm_eps
    )
    q_B_T_H_C = jnp.einsum("bte,ehc->bthc", h_B_T_E, layer["wq_E_H_C"])
    k_B_T_N_C = jnp.einsum("bte,enc->btnc", h_B_T_E, layer["wk_E_N_C"])
    v_B_T_N_C = jnp.einsum("bte,enc->btnc", h_B_T_E, layer["wv_E_N_C"])
    return AttentionInputs(
        q_B_T_H_C=_rope(q_B_T_H_C, positions_B_T, config.rope_base),
        k_B_T_N_C=_rope(k_B_T_N_C, positions_B_T, config.rope_base),
        v_B_T_N_C=v_B_T_N_C,
    )


def attend(
    q_B_T_H_C: jax.Array, k_B_S_N_C: jax.Array, v_B_S_N_C: jax.Array, allowed_B_T_S: jax.Array
) -> jax.Array:
    """Softmax attention of each query over the key positions it is `allowed_B_T_S` (bool).

    Returns float32 `[B, T, H, C]`. Query head `h` attends with key/value head `h` (`N = H`).
    """
    scale = 1.0 / math.sqrt(q_B_T_H_C.shape[-1])
    scores_B_H_T_S = jnp.einsum("bthc,bshc->bhts", q_B_T_H_C, k_B_S_N_C) * scale
    scores_B_H_T_S = jnp.where(allowed_B_T_S[:, None, :, :], scores_B_H_T_S, NEG_INF)
    weights_B_H_T_S = jax.nn.softmax(scores_B_H_T_S, axis=-1)
    return jnp.einsum("bhts,bshc->bthc", weights_B_H_T_S, v_B_S_N_C)


def finish_block(
    layer: Params, x_B_T_E: jax.Array, attn_B_T_H_C: jax.Array, config: ModelConfig
) -> jax.Array:
    """The rest of one block: output projection and residual, then the GELU MLP and residual.

    Returns the new residual stream, float32 `[B, T, E]`.
    """
    x_B_T_E = x_B_T_E + jnp.einsum("bthc,hce->bte", attn_B_T_H_C, layer["wo_H_C_E"])
    h_B_T_E = _layer_norm(
        x_B_T_E, layer["mlp_norm_scale_E"], layer["mlp_norm_bias_E"], config.norm_eps
    )
    h_B_T_F = jax.nn.gelu(h_B_T_E @ layer["w_in_E_F"] + layer["b_in_F"][None, None, :])
    out_B_T_E: jax.Array = h_B_T_F @ layer["w_out_F_E"] + layer["b_out_E"][None, None, :]
    return x_B_T_E + out_B_T_E


def unembed(params: Params, x_B_T_E: jax.Array, config: ModelConfig) -> jax.Array:
    """Final LayerNorm and unembedding: logits float32 `[B, T, V]` of the stream `x_B_T_E`."""
    h_B_T_E = _layer_norm(
        x_B_T_E, params["final_norm_scale_E"], params["final_norm_bias_E"], config.norm_eps
    )
    unembed_E_V: jax.Array = params["unembed_E_V"]
    return h_B_T_E @ unembed_E_V


def forward(params: Params, tokens_B_T: jax.Array, config: ModelConfig) -> ForwardOutput:
    """Full causal forward of int32 `tokens_B_T`: logits `[B, T, V]` and the RoPE'd keys and
    values of every layer, each float32 `[L, B, T, N, C]` (what a KV cache holds)."""
    b, t = tokens_B_T.shape
    positions_B_T = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None, :], (b, t))
    causal_T_S = jnp.tril(jnp.ones((t, t), bool))
    allowed_B_T_S = jnp.broadcast_to(causal_T_S[None, :, :], (b, t, t))
    x_B_T_E = params["embed_V_E"][tokens_B_T]

    def block(x_B_T_E: jax.Array, layer: Params) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        q_B_T_H_C, k_B_T_N_C, v_B_T_N_C = qkv(layer, x_B_T_E, positions_B_T, config)
        attn_B_T_H_C = attend(q_B_T_H_C, k_B_T_N_C, v_B_T_N_C, allowed_B_T_S)
        return finish_block(layer, x_B_T_E, attn_B_T_H_C, config), (k_B_T_N_C, v_B_T_N_C)

    x_B_T_E, (k_L_B_T_N_C, v_L_B_T_N_C) = jax.lax.scan(block, x_B_T_E, params["layers"])
    return ForwardOutput(
        logits_B_T_V=unembed(params, x_B_T_E, config),
        k_L_B_T_N_C=k_L_B_T_N_C,
        v_L_B_T_N_C=v_L_B_T_N_C,
    )


def _logits(params: Params, tokens_B_T: jax.Array, config: ModelConfig) -> jax.Array:
    return forward(params, tokens_B_T, config).logits_B_T_V


def target_logprobs_fn(
    params: Params, input_tokens_B_T: jax.Array, target_tokens_B_T: jax.Array, config: ModelConfig
) -> jax.Array:
    """The un-jitted `target_logprobs`, for composing inside other jitted functions.

    Args:
        params: the params pytree (differentiable).
        input_tokens_B_T: int32 `[B, T]` right-padded model inputs.
        target_tokens_B_T: int32 `[B, T]` the token each input position predicts.
        config: the model shape (must be static in the caller's `jit`).

    Returns:
        float32 `[B, T]`: `log p(target_tokens_B_T[b, t] | input_tokens_B_T[b, : t + 1])`.
    """
    logprobs_B_T_V = jax.nn.log_softmax(_logits(params, input_tokens_B_T, config), axis=-1)
    picked_B_T_1 = jnp.take_along_axis(logprobs_B_T_V, target_tokens_B_T[:, :, None], axis=-1)
    return picked_B_T_1[:, :, 0]


logits = jax.jit(_logits, static_argnames="config")
logits.__doc__ = """Next-token logits, float32 `[B, T, V]`, of int32 `tokens_B_T` (jitted).

`config` is static. Row `t` is the distribution after `tokens[:, : t + 1]`.
"""

target_logprobs = jax.jit(target_logprobs_fn, static_argnames="config")
target_logprobs.__doc__ = """Log-probability of each target token, float32 `[B, T]` (jitted).

`out[b, t] = log softmax(logits(params, input_tokens_B_T)[b, t])[target_tokens_B_T[b, t]]`.
Both token arrays are int32 `[B, T]`; `config` is static. Differentiable in `params` (the
un-jitted version is what `shell.local` differentiates inside its own jitted step).
"""
