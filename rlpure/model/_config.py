"""Model shapes: `ModelConfig` (every family), `RopeScaling`, and the named local models.

A `ModelConfig` is hashable and static under `jit`; `rlpure.model._transformer` reads it to
pick the family's layers, and `rlpure.model._hf_names.config_from_hf` builds one from a
Hugging Face `config.json`. The defaults of the fields added for the open-weight families keep
the toy `rlpure` models exactly as they were (same params, same checkpoints).

Families:
    - `"rlpure"`: the toy models: pre-LayerNorm (scale and bias), GELU MLP with biases, untied
      unembedding, no attention biases.
    - `"llama"`: RMSNorm, SwiGLU MLP (`down(silu(gate(x)) * up(x))`), no biases (Llama 2/3,
      SmolLM2).
    - `"qwen2"`: llama plus biases on the q/k/v projections (Qwen2, Qwen2.5).
    - `"qwen3"`: llama plus a per-head RMSNorm of queries and keys before RoPE (Qwen3 dense).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

import msgspec

from rlpure.model._tokenizer import VOCAB_SIZE

__all__ = [
    "MODEL_CONFIGS",
    "Family",
    "ModelConfig",
    "ParamDtype",
    "RopeScaling",
    "get_model_config",
]

Family = Literal["rlpure", "llama", "qwen2", "qwen3"]
ParamDtype = Literal["float32", "bfloat16"]


class RopeScaling(msgspec.Struct, frozen=True, kw_only=True):
    """Llama 3.1's RoPE frequency scaling (Hugging Face `rope_type: "llama3"`).

    With wavelength `λ_j = 2π / inv_freq_j` and `L0 = original_max_position_embeddings`:
    `inv_freq_j` is kept when `λ_j < L0 / high_freq_factor`, divided by `factor` when
    `λ_j > L0 / low_freq_factor`, and otherwise interpolated as `(1 − s) inv_freq_j / factor +
    s inv_freq_j` with `s = (L0 / λ_j − low_freq_factor) / (high_freq_factor −
    low_freq_factor)` (Meta's Llama 3.1 reference code; transformers'
    `_compute_llama3_parameters`).

    Attributes:
        factor: divisor of the low frequencies (8 for Llama 3.1, 32 for Llama 3.2).
        low_freq_factor: `L0 / low_freq_factor` is the longest wavelength kept unscaled-ish.
        high_freq_factor: `L0 / high_freq_factor` is the shortest wavelength left unchanged.
        original_max_position_embeddings: `L0`, the pretraining context length.
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


class ModelConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Shape and initialisation of the transformer (hashable: static under `jit`).

    Attributes:
        vocab_size: number of token ids `V`.
        d_model: model (residual) width `E`; must be divisible by `n_heads` unless
            `head_width` is set.
        n_layers: number of transformer blocks `L`.
        n_heads: attention (query) heads `H`.
        d_ff: MLP hidden width `F`.
        max_seq_len: longest sequence (prompt + completion) the model accepts.
        init_std: standard deviation of every weight matrix at init. A prototype found 0.1
            (with Adam lr 1e-4–3e-4) works for RL from scratch where 0.02 collapsed.
        rope_base: RoPE frequency base (Hugging Face `rope_theta`).
        norm_eps: LayerNorm / RMSNorm epsilon.
        family: which layers (see the module docstring); `"rlpure"` for the toy models.
        n_kv_heads: key/value heads `N` (grouped-query attention: query head `h` reads
            key/value head `h // (H / N)`); `None` means `N = H`. Must divide `n_heads`.
        head_width: head width `C`; `None` means `d_model // n_heads` (Qwen3 sets it). Even.
        tie_embeddings: the unembedding is the transposed token embedding (no `unembed_E_V`).
        rope_scaling: Llama 3.x frequency scaling, or `None`.
        dtype: the dtype params are stored and matrices multiplied in; norms, softmax,
            logits, logprobs and the residual stream stay float32.
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
    family: Family = "rlpure"
    n_kv_heads: int | None = None
    head_width: int | None = None
    tie_embeddings: bool = False
    rope_scaling: RopeScaling | None = None
    dtype: ParamDtype = "float32"

    def __post_init__(self) -> None:
        for field in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ModelConfig.{field}: expected a positive int, got {value!r}")
        for field in ("n_kv_heads", "head_width"):
            value = getattr(self, field)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1
            ):
                raise ValueError(
                    f"ModelConfig.{field}: expected a positive int or None, got {value!r}"
                )
        if self.head_width is None and self.d_model % self.n_heads:
            raise ValueError(
                f"ModelConfig.d_model: {self.d_model} is not divisible by n_heads {self.n_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"ModelConfig: head width {self.head_dim} must be even for rotary embeddings"
            )
        if self.n_heads % self.kv_heads:
            raise ValueError(
                f"ModelConfig.n_kv_heads: {self.kv_heads} does not divide n_heads {self.n_heads}"
            )
        if not (math.isfinite(self.init_std) and self.init_std > 0):
            raise ValueError(f"ModelConfig.init_std: expected > 0, got {self.init_std}")
        if not (math.isfinite(self.rope_base) and self.rope_base > 1):
            raise ValueError(f"ModelConfig.rope_base: expected > 1, got {self.rope_base}")
        if not (math.isfinite(self.norm_eps) and self.norm_eps > 0):
            raise ValueError(f"ModelConfig.norm_eps: expected > 0, got {self.norm_eps}")
        if self.family not in ("rlpure", "llama", "qwen2", "qwen3"):
            raise ValueError(
                f"ModelConfig.family: expected rlpure, llama, qwen2 or qwen3, got {self.family!r}"
            )
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"ModelConfig.dtype: expected float32 or bfloat16, got {self.dtype!r}")
        scaling = self.rope_scaling
        if scaling is not None and not (
            scaling.factor > 0
            and scaling.high_freq_factor > scaling.low_freq_factor > 0
            and scaling.original_max_position_embeddings > 0
        ):
            raise ValueError(
                "ModelConfig.rope_scaling: expected factor > 0, high_freq_factor > "
                f"low_freq_factor > 0 and original_max_position_embeddings > 0, got {scaling!r}"
            )

    @property
    def head_dim(self) -> int:
        """Head width `C` (`head_width`, or `d_model // n_heads`)."""
        return self.head_width if self.head_width is not None else self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads `N` (`n_kv_heads`, or `n_heads`)."""
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads


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
