"""A small decoder-only transformer in pure JAX: training logprobs, an Adam step, and sampling.

This is the maths behind the local backend (`shell.local_backend`); it is pure (no IO, no
global mutable state, randomness only through explicit keys) and every entry point is jitted.

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
- Sampling (`sample_tokens`) prefills the padded prompts once into a KV cache, then decodes one
  token per row per step inside a `jax.lax.while_loop` over a fixed (bucketed) number of new
  tokens, leaving early when every row has stopped. A row stops on a stop token, on a stop
  sequence completed by its generated tokens (the stop token/sequence is *included* in the
  output, as on Tinker), or at its own `max_new_tokens` (`"length"`). Returned logprobs are
  the log-softmax of the chosen token under the tempered distribution it was drawn from, as
  Tinker reports them; at temperature 1 (or 0, greedy) that is the quantity `target_logprobs`
  computes, so on-policy importance ratios are 1 (to float32 rounding).
- Shapes are bucketed by the caller (see `bucket_size`) so a run compiles a handful of times;
  `config` and the number of new tokens are static under `jit`, everything else is traced.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp
import msgspec
import numpy as np
import optax

from rlpure import packing
from rlpure.tokenizer import VOCAB_SIZE

__all__ = [
    "MODEL_CONFIGS",
    "AdamHyperparams",
    "ModelConfig",
    "Params",
    "SampleBatch",
    "SampleOutput",
    "apply_adam_update",
    "bucket_size",
    "count_params",
    "get_model_config",
    "init_optimizer_state",
    "init_params",
    "logits",
    "sample_tokens",
    "target_logprobs",
    "target_logprobs_fn",
]

Params = dict[str, Any]

_NEG_INF = -1e30  # finite "minus infinity" for masked attention scores (exp underflows to 0)


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


def bucket_size(n: int, *, minimum: int = 8) -> int:
    """The padded size for `n` items: the next power of two, at least `minimum`.

    Examples:
        >>> [bucket_size(n) for n in (0, 1, 8, 9, 100)]
        [8, 8, 8, 16, 128]
    """
    return packing.bucket_size(n, minimum=minimum, steps_per_octave=1)


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


def _qkv(
    layer: Params, x_B_T_D: jax.Array, positions_B_T: jax.Array, config: ModelConfig
) -> tuple[jax.Array, jax.Array, jax.Array]:
    h = _layer_norm(x_B_T_D, layer["attn_norm_scale_D"], layer["attn_norm_bias_D"], config.norm_eps)
    q = jnp.einsum("btd,dhk->bthk", h, layer["wq_D_H_K"])
    k = jnp.einsum("btd,dhk->bthk", h, layer["wk_D_H_K"])
    v = jnp.einsum("btd,dhk->bthk", h, layer["wv_D_H_K"])
    return _rope(q, positions_B_T, config.rope_base), _rope(k, positions_B_T, config.rope_base), v


def _attend(
    q_B_T_H_K: jax.Array, k_B_S_H_K: jax.Array, v_B_S_H_K: jax.Array, allowed_B_T_S: jax.Array
) -> jax.Array:
    scale = 1.0 / math.sqrt(q_B_T_H_K.shape[-1])
    scores = jnp.einsum("bthk,bshk->bhts", q_B_T_H_K, k_B_S_H_K) * scale
    scores = jnp.where(allowed_B_T_S[:, None, :, :], scores, _NEG_INF)
    weights = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhts,bshk->bthk", weights, v_B_S_H_K)


def _finish_block(
    layer: Params, x_B_T_D: jax.Array, attn_B_T_H_K: jax.Array, config: ModelConfig
) -> jax.Array:
    x = x_B_T_D + jnp.einsum("bthk,hkd->btd", attn_B_T_H_K, layer["wo_H_K_D"])
    h = _layer_norm(x, layer["mlp_norm_scale_D"], layer["mlp_norm_bias_D"], config.norm_eps)
    h = jax.nn.gelu(h @ layer["w_in_D_F"] + layer["b_in_F"])
    return x + h @ layer["w_out_F_D"] + layer["b_out_D"]


def _unembed(params: Params, x_B_T_D: jax.Array, config: ModelConfig) -> jax.Array:
    h = _layer_norm(
        x_B_T_D, params["final_norm_scale_D"], params["final_norm_bias_D"], config.norm_eps
    )
    return h @ params["unembed_D_V"]


def _forward(
    params: Params, tokens_B_T: jax.Array, config: ModelConfig
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """Full causal forward: logits `[B, T, V]` and RoPE'd keys/values, each `[L, B, T, H, K]`."""
    _, t = tokens_B_T.shape
    positions_B_T = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), tokens_B_T.shape)
    causal_T_T = jnp.tril(jnp.ones((t, t), bool))
    allowed = jnp.broadcast_to(causal_T_T, (tokens_B_T.shape[0], t, t))
    x = params["embed_V_D"][tokens_B_T]

    def block(x: jax.Array, layer: Params) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        q, k, v = _qkv(layer, x, positions_B_T, config)
        return _finish_block(layer, x, _attend(q, k, v, allowed), config), (k, v)

    x, kv = jax.lax.scan(block, x, params["layers"])
    return _unembed(params, x, config), kv


def _logits(params: Params, tokens_B_T: jax.Array, config: ModelConfig) -> jax.Array:
    return _forward(params, tokens_B_T, config)[0]


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
un-jitted version is what `shell.local_backend` differentiates inside its own jitted step).
"""

target_logprobs_fn = _target_logprobs
"""The un-jitted `target_logprobs`, for composing inside other jitted functions."""


# --- optimiser -------------------------------------------------------------------------------


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
) -> tuple[Params, optax.OptState, jax.Array]:
    """One clipped AdamW step (see `AdamHyperparams`); jitted, hyper-parameters traced.

    Returns:
        `(new_params, new_opt_state, grad_norm)` where `grad_norm` is the global norm before
        clipping.
    """
    grad_norm = optax.tree.norm(grads)
    clip = jnp.asarray(hyper.grad_clip_norm, jnp.float32)
    factor = jnp.where(clip > 0, jnp.minimum(1.0, clip / jnp.maximum(grad_norm, 1e-30)), 1.0)
    grads = jax.tree_util.tree_map(lambda g: g * factor, grads)
    updates, new_state = _adamw(hyper).update(grads, opt_state, params)
    return optax.apply_updates(params, updates), new_state, grad_norm


# --- sampling --------------------------------------------------------------------------------


class SampleBatch(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """A padded batch of sampling requests, one row per sample (travels through `jit`).

    Attributes:
        prompt_tokens_B_T: int32 `[B, T]` right-padded prompts (each row at least 1 token).
        prompt_length_B: int32 `[B]` real prompt length of each row (≥ 1).
        max_new_tokens_B: int32 `[B]` tokens each row may generate (0 for padding rows).
        temperature_B: float32 `[B]`; 0 means greedy (argmax).
        top_k_B: int32 `[B]`; keep the `k` most likely tokens, `≤ 0` keeps all.
        top_p_B: float32 `[B]`; nucleus mass kept, `≥ 1` keeps all.
        key_material_B_K: uint32 `[B, K]` per-row key material `(m_0, …, m_{K−1})`, `K ≥ 1`:
            the row's key is `key(m_0)` folded (`jax.random.fold_in`) with `m_1`, …, `m_{K−1}`,
            then with the step index at each step, so a row's draws depend on its material
            only, never on the rest of the batch.
        stop_token_mask_B_V: bool `[B, V]`, True for ids that end the row.
        stop_seqs_B_S_L: int32 `[B, S, L]` stop sequences, **right-aligned**, left-padded with
            -1 (a wildcard); all -1 for an unused slot.
        stop_seq_valid_B_S: bool `[B, S]`, True for used slots.
    """

    prompt_tokens_B_T: jax.Array | np.ndarray
    prompt_length_B: jax.Array | np.ndarray
    max_new_tokens_B: jax.Array | np.ndarray
    temperature_B: jax.Array | np.ndarray
    top_k_B: jax.Array | np.ndarray
    top_p_B: jax.Array | np.ndarray
    key_material_B_K: jax.Array | np.ndarray
    stop_token_mask_B_V: jax.Array | np.ndarray
    stop_seqs_B_S_L: jax.Array | np.ndarray
    stop_seq_valid_B_S: jax.Array | np.ndarray


class SampleOutput(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """What `sample_tokens` returns.

    Attributes:
        tokens_B_M: int32 `[B, M]` generated tokens, valid on `[0, num_tokens_B[b])`, 0 after.
        logprobs_B_M: float32 `[B, M]` tempered logprob of each generated token (see above).
        num_tokens_B: int32 `[B]` tokens generated per row.
        stopped_B: bool `[B]` True when the row ended on a stop token/sequence (`"stop"`),
            False when it ran out of tokens (`"length"`).
    """

    tokens_B_M: jax.Array
    logprobs_B_M: jax.Array
    num_tokens_B: jax.Array
    stopped_B: jax.Array


for _record in (SampleBatch, SampleOutput):
    jax.tree_util.register_dataclass(
        _record, data_fields=list(_record.__struct_fields__), meta_fields=[]
    )


def _filter_logits(logits_B_V: jax.Array, top_k_B: jax.Array, top_p_B: jax.Array) -> jax.Array:
    """Masks logits outside each row's top-k set and top-p nucleus to `_NEG_INF`."""
    v = logits_B_V.shape[-1]
    sorted_B_V = -jnp.sort(-logits_B_V, axis=-1)
    k_B = jnp.where(top_k_B > 0, jnp.minimum(top_k_B, v), v)
    kth_B = jnp.take_along_axis(sorted_B_V, (k_B - 1)[:, None], axis=-1)
    probs_B_V = jax.nn.softmax(sorted_B_V, axis=-1)
    mass_before_B_V = jnp.cumsum(probs_B_V, axis=-1) - probs_B_V
    keep_sorted = mass_before_B_V < top_p_B[:, None]
    n_keep_B = jnp.maximum(jnp.sum(keep_sorted, axis=-1), 1)
    pth_B = jnp.take_along_axis(sorted_B_V, (n_keep_B - 1)[:, None], axis=-1)
    pth_B = jnp.where(top_p_B[:, None] >= 1.0, -jnp.inf, pth_B)
    threshold_B = jnp.maximum(kth_B, pth_B)
    return jnp.where(logits_B_V >= threshold_B, logits_B_V, _NEG_INF)


def _row_keys(key_material_B_K: jax.Array) -> jax.Array:
    def one(material_K: jax.Array) -> jax.Array:
        key = jax.random.key(material_K[0])
        for k in range(1, material_K.shape[0]):
            key = jax.random.fold_in(key, material_K[k])
        return key

    return jax.vmap(one)(key_material_B_K)


@partial(jax.jit, static_argnames=("config", "max_new_tokens"))
def sample_tokens(
    params: Params, batch: SampleBatch, *, config: ModelConfig, max_new_tokens: int
) -> SampleOutput:
    """Samples up to `max_new_tokens` tokens for every row of `batch` (jitted).

    Prefills the prompts into a KV cache of length `T + max_new_tokens`, then, per step: draw
    the next token of every live row from `softmax(filter(logits) / temperature)` (argmax when
    the temperature is 0), record its logprob `log_softmax(logits / temperature)` (as Tinker's
    sampler reports it: tempered, not renormalised over the top-k/top-p set; at temperature 0
    the untempered one), stop the row if the token is a stop
    token, if its generated tail now ends with one of its stop sequences, or if it reached its
    `max_new_tokens_B`; feed the token back through one cached decoder step. Exits early when
    every row has stopped.

    Args:
        params: model params.
        batch: the padded requests (see `SampleBatch`); `B` and `T` should be bucketed.
        config: model shape (static).
        max_new_tokens: `M`, the static bucket ≥ every `max_new_tokens_B` (static).

    Returns:
        `SampleOutput` with `[B, M]` tokens/logprobs, `[B]` counts and stop flags.
    """
    prompt_B_T = jnp.asarray(batch.prompt_tokens_B_T, jnp.int32)
    length_B = jnp.asarray(batch.prompt_length_B, jnp.int32)
    max_new_B = jnp.asarray(batch.max_new_tokens_B, jnp.int32)
    temperature_B = jnp.asarray(batch.temperature_B, jnp.float32)
    stop_mask_B_V = jnp.asarray(batch.stop_token_mask_B_V, bool)
    stop_seqs_B_S_L = jnp.asarray(batch.stop_seqs_B_S_L, jnp.int32)
    stop_valid_B_S = jnp.asarray(batch.stop_seq_valid_B_S, bool)
    top_k_B = jnp.asarray(batch.top_k_B, jnp.int32)
    top_p_B = jnp.asarray(batch.top_p_B, jnp.float32)
    b, t = prompt_B_T.shape
    m = max_new_tokens
    cache_len = t + m
    window = stop_seqs_B_S_L.shape[-1]
    rows = jnp.arange(b)

    # Prefill: full causal pass over the padded prompts; cache their keys/values.
    logits_B_T_V, kv = _forward(params, prompt_B_T, config)
    pad = ((0, 0), (0, 0), (0, m), (0, 0), (0, 0))
    cache = (jnp.pad(kv[0], pad), jnp.pad(kv[1], pad))  # each [L, B, T + M, H, K]
    logits_B_V = logits_B_T_V[rows, length_B - 1]
    keys_B = _row_keys(jnp.asarray(batch.key_material_B_K, jnp.uint32))
    needs_filter = jnp.any(top_k_B > 0) | jnp.any(top_p_B < 1.0)

    state = {
        "step": jnp.zeros((), jnp.int32),
        "logits_B_V": logits_B_V,
        "cache": cache,
        "done_B": max_new_B <= 0,
        "stopped_B": jnp.zeros((b,), bool),
        "num_B": jnp.zeros((b,), jnp.int32),
        "tokens_B_M": jnp.zeros((b, m), jnp.int32),
        "logprobs_B_M": jnp.zeros((b, m), jnp.float32),
        "tail_B_L": jnp.full((b, window), -2, jnp.int32),
    }

    def cond(state: dict[str, Any]) -> jax.Array:
        return (state["step"] < m) & ~jnp.all(state["done_B"])

    def body(state: dict[str, Any]) -> dict[str, Any]:
        step = state["step"]
        live_B = ~state["done_B"]
        logits_B_V = state["logits_B_V"]
        step_keys = jax.vmap(lambda key: jax.random.fold_in(key, step))(keys_B)
        safe_temp_B = jnp.where(temperature_B > 0, temperature_B, 1.0)
        filtered_B_V = jax.lax.cond(  # the sort costs as much as a decoder step: skip it
            needs_filter,
            lambda x: _filter_logits(x, top_k_B, top_p_B),
            lambda x: x,
            logits_B_V,
        )
        scaled_B_V = filtered_B_V / safe_temp_B[:, None]
        drawn_B = jax.vmap(jax.random.categorical)(step_keys, scaled_B_V)
        token_B = jnp.where(temperature_B > 0, drawn_B, jnp.argmax(logits_B_V, axis=-1))
        token_B = token_B.astype(jnp.int32)
        # The sampled token's logprob under the tempered distribution it was drawn from, as
        # Tinker reports it (unfiltered by top-k/top-p; untempered when greedy).
        scaled_logits_B_V = logits_B_V / safe_temp_B[:, None]
        logprob_B = jax.nn.log_softmax(scaled_logits_B_V, axis=-1)[rows, token_B]

        tokens_B_M = state["tokens_B_M"].at[:, step].set(jnp.where(live_B, token_B, 0))
        logprobs_B_M = state["logprobs_B_M"].at[:, step].set(jnp.where(live_B, logprob_B, 0.0))
        num_B = state["num_B"] + live_B.astype(jnp.int32)
        tail_B_L = jnp.concatenate([state["tail_B_L"][:, 1:], token_B[:, None]], axis=1)
        seq_hit_B_S = jnp.all(
            (stop_seqs_B_S_L == -1) | (stop_seqs_B_S_L == tail_B_L[:, None, :]), axis=-1
        )
        hit_B = stop_mask_B_V[rows, token_B] | jnp.any(seq_hit_B_S & stop_valid_B_S, axis=-1)
        stopped_B = state["stopped_B"] | (live_B & hit_B)
        done_B = state["done_B"] | (live_B & (hit_B | (num_B >= max_new_B)))

        # One cached decoder step on the new token at position length + step.
        pos_B = length_B + step
        x = params["embed_V_D"][token_B][:, None, :]
        allowed_B_1_S = (jnp.arange(cache_len)[None, :] <= pos_B[:, None])[:, None, :]

        def block(
            x: jax.Array, layer_and_cache: tuple[Params, jax.Array, jax.Array]
        ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
            layer, k_cache, v_cache = layer_and_cache
            q, k, v = _qkv(layer, x, pos_B[:, None], config)
            k_cache = k_cache.at[rows, pos_B].set(k[:, 0])
            v_cache = v_cache.at[rows, pos_B].set(v[:, 0])
            x = _finish_block(layer, x, _attend(q, k_cache, v_cache, allowed_B_1_S), config)
            return x, (k_cache, v_cache)

        x, new_cache = jax.lax.scan(block, x, (params["layers"], *state["cache"]))
        next_logits_B_V = _unembed(params, x, config)[:, 0]

        return {
            "step": step + 1,
            "logits_B_V": next_logits_B_V,
            "cache": new_cache,
            "done_B": done_B,
            "stopped_B": stopped_B,
            "num_B": num_B,
            "tokens_B_M": tokens_B_M,
            "logprobs_B_M": logprobs_B_M,
            "tail_B_L": jnp.where(live_B[:, None], tail_B_L, state["tail_B_L"]),
        }

    final: dict[str, Any] = jax.lax.while_loop(cond, body, state)
    return SampleOutput(
        tokens_B_M=final["tokens_B_M"],
        logprobs_B_M=final["logprobs_B_M"],
        num_tokens_B=final["num_B"],
        stopped_B=final["stopped_B"],
    )
