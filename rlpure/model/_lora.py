"""LoRA adapters (Hu et al. 2021, arXiv 2106.09685) with Tinker's conventions, pure JAX.

A LoRA adapter on a base matrix `W` (input axes `I`, output axes `O`) is a pair `A` `[I, R]`,
`B` `[R, O]` (rank `R`); the adapted layer computes `x W + (α / R) (x A) B`, i.e. the
effective weight is `W + (α / R) A B`.

Tinker's conventions, which this module follows:
- **Scale `α / R` with `α = 32`.** Tinker exports its adapters as PEFT checkpoints whose
  `adapter_config.json` carries `lora_alpha` and `r`, and the cookbook merges them as
  `W + (lora_alpha / r) · B A` (`tinker_cookbook/weights/_merge_utils.py`,
  `validate_adapter_config` returns `lora_alpha / r`); the cookbook's
  `hyperparam_utils.get_lora_lr_over_full_finetune_lr(model_name, lora_alpha=32)` takes 32 as
  Tinker's `lora_alpha`, the value of Thinking Machines' "LoRA Without Regret" (Schulman et
  al. 2025), where the `1/R` factor makes the optimal learning rate nearly independent of the
  rank (and about 10× the full fine-tuning one).
- **Init**: `A ~ U(−1/√fan_in, 1/√fan_in)` (PEFT's Kaiming-uniform with `a = √5`; `fan_in`
  is the size of `I`), `B = 0`, so step 0 computes exactly the base model.
- **Targets** are named by `create_lora_training_client`'s flags: `train_attn` → the q, k, v
  and o projections of every layer; `train_mlp` → the MLP matrices (gate, up and down for the
  llama/qwen families, in and out for the toy `rlpure` family); `train_unembed` → the
  unembedding (the transposed embedding when tied; the adapter is then on the output side
  only, the input embedding stays the base one). The cookbook's
  `hyperparam_utils.get_lora_param_count` table counts exactly these matrices (e.g.
  Llama-3.2-1B: attn 212,992 = 16 × (4096 + 2560 + 2560 + 4096) per rank).

Adapter pytree: `{"layers": {stem_a_I_R, stem_b_R_O, ...}, "unembed_a_E_R", "unembed_b_R_V"}`
(e.g. `wq_a_E_R` `[L, E, R]` and `wq_b_R_H_C` `[L, R, H, C]`, stacked over layers like the
base params); adapters are float32 whatever the base dtype. `rlpure.model._transformer` applies
them without merging (`forward(..., adapters=, lora=)`: the backward pass then never forms a
full `[I, O]` weight gradient; only the unembedding's adapter is merged on the fly when a call
has at least `E` positions, with a hand-written VJP); `merge_lora` folds them into a params
copy for sampling.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from types import MappingProxyType
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import msgspec

from rlpure.model._config import ModelConfig

__all__ = [
    "LORA_TARGETS",
    "UNEMBED_TARGET",
    "LoraConfig",
    "LoraTarget",
    "count_lora_params",
    "init_lora",
    "lora_targets",
    "merge_lora",
    "merged_unembedding",
]

Params = dict[str, Any]


class LoraConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Which matrices get adapters, their rank and scale (hashable: static under `jit`).

    Attributes:
        rank: `R`, the adapter rank (Tinker's `rank` / PEFT's `r`).
        alpha: `α`; the adapter's output is scaled by `α / R` (Tinker: 32).
        train_attn: adapters on the q, k, v, o projections.
        train_mlp: adapters on the MLP matrices.
        train_unembed: an adapter on the unembedding.
    """

    rank: int
    alpha: float = 32.0
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ValueError(f"LoraConfig.rank: expected a positive int, got {self.rank!r}")
        if not (math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"LoraConfig.alpha: expected > 0, got {self.alpha!r}")
        if not (self.train_attn or self.train_mlp or self.train_unembed):
            raise ValueError(
                "LoraConfig: at least one of train_attn, train_mlp, train_unembed must be True"
            )

    @property
    def scale(self) -> float:
        """`α / R`, the factor on every adapter's output."""
        return self.alpha / self.rank


class LoraTarget(NamedTuple):
    """One adapted base matrix: its params name, its input and output axis letters."""

    name: str  # e.g. "wq_E_H_C" (in `params["layers"]`) or "unembed_E_V" (top level)
    in_axes: str  # e.g. "E"
    out_axes: str  # e.g. "H_C"

    @property
    def stem(self) -> str:
        """The name without its axis suffix (`"wq"`)."""
        return self.name[: len(self.name) - len(self.in_axes) - len(self.out_axes) - 2]

    @property
    def a_name(self) -> str:
        """The `A` factor's name (`"wq_a_E_R"`)."""
        return f"{self.stem}_a_{self.in_axes}_R"

    @property
    def b_name(self) -> str:
        """The `B` factor's name (`"wq_b_R_H_C"`)."""
        return f"{self.stem}_b_R_{self.out_axes}"


_ATTN = (
    LoraTarget("wq_E_H_C", "E", "H_C"),
    LoraTarget("wk_E_N_C", "E", "N_C"),
    LoraTarget("wv_E_N_C", "E", "N_C"),
    LoraTarget("wo_H_C_E", "H_C", "E"),
)
_MLP_SWIGLU = (
    LoraTarget("w_gate_E_F", "E", "F"),
    LoraTarget("w_up_E_F", "E", "F"),
    LoraTarget("w_down_F_E", "F", "E"),
)
_MLP_GELU = (LoraTarget("w_in_E_F", "E", "F"), LoraTarget("w_out_F_E", "F", "E"))
UNEMBED_TARGET = LoraTarget("unembed_E_V", "E", "V")

LORA_TARGETS: Mapping[str, LoraTarget] = MappingProxyType(
    {target.name: target for target in (*_ATTN, *_MLP_SWIGLU, *_MLP_GELU, UNEMBED_TARGET)}
)
"""Every matrix an adapter can target, by its params name."""


def lora_targets(config: ModelConfig, lora: LoraConfig) -> tuple[LoraTarget, ...]:
    """The per-layer matrices `lora` adapts in a model of `config` (the unembedding aside)."""
    targets: tuple[LoraTarget, ...] = ()
    if lora.train_attn:
        targets += _ATTN
    if lora.train_mlp:
        targets += _MLP_GELU if config.family == "rlpure" else _MLP_SWIGLU
    return targets


def _axis_sizes(config: ModelConfig) -> dict[str, int]:
    return {
        "E": config.d_model,
        "H": config.n_heads,
        "N": config.kv_heads,
        "C": config.head_dim,
        "F": config.d_ff,
        "V": config.vocab_size,
    }


def _shape(axes: str, sizes: dict[str, int]) -> tuple[int, ...]:
    return tuple(sizes[letter] for letter in axes.split("_"))


@partial(jax.jit, static_argnames=("config", "lora"))
def init_lora(key: jax.Array, config: ModelConfig, lora: LoraConfig) -> Params:
    """Fresh adapters: `A ~ U(±1/√fan_in)`, `B = 0` (so the adapted model equals the base;
    jitted, `config` and `lora` static).

    Args:
        key: a JAX PRNG key.
        config: the base model's shape.
        lora: which matrices, and the rank.

    Returns:
        The adapter pytree (float32; see the module docstring for its names).

    Examples:
        >>> from rlpure.model import get_model_config
        >>> adapters = init_lora(jax.random.key(0), get_model_config("rlpure/tiny"),
        ...                      LoraConfig(rank=2, train_mlp=False, train_unembed=False))
        >>> sorted(adapters["layers"])[:2], adapters["layers"]["wq_a_E_R"].shape
        (['wk_a_E_R', 'wk_b_R_N_C'], (2, 64, 2))
    """
    sizes = _axis_sizes(config)
    r, n_layers = lora.rank, config.n_layers
    targets = lora_targets(config, lora)
    keys = jax.random.split(key, len(targets) + 1)

    def factor_a(key: jax.Array, in_shape: tuple[int, ...], lead: tuple[int, ...]) -> jax.Array:
        bound = 1.0 / math.sqrt(math.prod(in_shape))
        return jax.random.uniform(key, (*lead, *in_shape, r), jnp.float32, -bound, bound)

    layers: Params = {}
    for target, target_key in zip(targets, keys[:-1], strict=True):
        in_shape, out_shape = _shape(target.in_axes, sizes), _shape(target.out_axes, sizes)
        layers[target.a_name] = factor_a(target_key, in_shape, (n_layers,))
        layers[target.b_name] = jnp.zeros((n_layers, r, *out_shape), jnp.float32)
    adapters: Params = {"layers": layers}
    if lora.train_unembed:
        adapters[UNEMBED_TARGET.a_name] = factor_a(keys[-1], (config.d_model,), ())
        adapters[UNEMBED_TARGET.b_name] = jnp.zeros((r, config.vocab_size), jnp.float32)
    return adapters


def count_lora_params(adapters: Params) -> int:
    """Total number of scalars in an adapter pytree."""
    return sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(adapters))


def _delta(a: jax.Array, b: jax.Array, target: LoraTarget, scale: float) -> jax.Array:
    """`scale · A B` of one (unstacked) target, shaped like the base matrix."""
    n_in = len(target.in_axes.split("_"))
    a_I_R = a.reshape(-1, a.shape[-1])
    b_R_O = b.reshape(b.shape[0], -1)
    delta = scale * (a_I_R @ b_R_O)
    return delta.reshape(*a.shape[:n_in], *b.shape[1:])


def merged_unembedding(
    w: jax.Array, a_E_R: jax.Array, b_R_V: jax.Array, scale: float, *, tied: bool
) -> jax.Array:
    """The unembedding with its adapter folded in, in `w`'s layout and dtype: `embed_V_E +
    scale (A B)ᵀ` when `tied` (`w` is the token embedding), else `unembed_E_V + scale A B`,
    summed in float32. `merge_lora` merges with it for samplers, `rlpure.model._lora_kernels`
    for a training call (`_adapted_unembed`)."""
    spec = "er,rv->ve" if tied else "er,rv->ev"
    delta = scale * jnp.einsum(spec, a_E_R, b_R_V)
    return (w.astype(jnp.float32) + delta).astype(w.dtype)


@partial(jax.jit, static_argnames=("config", "lora"))
def merge_lora(
    params: Params, adapters: Params, *, config: ModelConfig, lora: LoraConfig
) -> Params:
    """A params copy with every adapter folded in: `W + (α / R) A B` (for samplers; jitted,
    `config` and `lora` static).

    For a tied model with an unembedding adapter, the merged params gain an untied
    `unembed_E_V = embed_V_Eᵀ + (α / R) A B` (the input embedding is not adapted); the forward
    pass uses `unembed_E_V` whenever params hold one, so the same `config` serves both.
    Merged matrices keep the base dtype.

    Args:
        params: the base params (not modified).
        adapters: from `init_lora` (or trained).
        config: the base model's shape.
        lora: the adapters' config (its scale and targets).

    Returns:
        New params with the same names (plus `unembed_E_V` for a tied model, see above).
    """
    scale = lora.scale
    layers = dict(params["layers"])
    for target in lora_targets(config, lora):
        base = layers[target.name]
        delta = jax.vmap(lambda a, b, t=target: _delta(a, b, t, scale))(
            adapters["layers"][target.a_name], adapters["layers"][target.b_name]
        )
        layers[target.name] = (base.astype(jnp.float32) + delta).astype(base.dtype)
    merged = dict(params)
    merged["layers"] = layers
    if lora.train_unembed:
        base_E_V = params["embed_V_E"].T if config.tie_embeddings else params["unembed_E_V"]
        merged["unembed_E_V"] = merged_unembedding(
            base_E_V,
            adapters[UNEMBED_TARGET.a_name],
            adapters[UNEMBED_TARGET.b_name],
            scale,
            tied=False,
        )
    return merged
