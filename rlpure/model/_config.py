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
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Literal

import msgspec
import numpy as np

from rlpure.model._tokenizer import VOCAB_SIZE

__all__ = [
    "MODEL_CONFIGS",
    "Family",
    "ModelConfig",
    "ParamDtype",
    "RopeScaling",
    "get_model_config",
    "llama3_rope_scaling_from_factors",
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


def llama3_rope_scaling_from_factors(
    factors_J: Sequence[float] | np.ndarray, *, rope_base: float, head_dim: int
) -> RopeScaling | None:
    """Llama 3.1's `RopeScaling` recovered from per-frequency divisors `r_j` (llama.cpp's GGUF
    tensor `rope_freqs.weight`: its rotary frequencies are `inv_freq_j / r_j`), or `None` when
    every divisor is 1.

    With `λ_j = 2π / inv_freq_j` the formula (`RopeScaling`) gives `r_j = 1` for short
    wavelengths, `factor` for long ones, and `1 / r_j = (1 − s_j) / factor + s_j` between, where
    `s_j = α / λ_j + β` is linear in `1 / λ_j` (`α = L0 / (high − low)`, `β = −low / (high −
    low)`). So `factor = max_j r_j`, a least-squares line through the interpolated `s_j` gives
    `α` and `β`, and of the three parameters only those two combinations matter: `L0 = −α / β`
    rounded (exact with Llama 3.x's `low_freq_factor = 1`), then `low = −β L0 / α`, `high = low
    + L0 / α`. The caller checks the result against the divisors.

    Args:
        factors_J: float `[J]` divisors (`J = head_dim / 2`), each ≥ 1.
        rope_base: RoPE base (`rope_theta`).
        head_dim: `C`, the rotary head width.

    Returns:
        The scaling, or `None` for all-ones divisors.

    Raises:
        ValueError: a length other than `head_dim / 2`, a divisor below 1 or not finite, or
            fewer than two interpolated frequencies (the line is then not determined).

    Examples:
        >>> import numpy as np
        >>> inv = 500000.0 ** (-np.arange(0, 128, 2) / 128)
        >>> lam = 2 * np.pi / inv
        >>> s = np.clip((8192 / lam - 1) / (4 - 1), 0, 1)
        >>> r = 1 / ((1 - s) / 8 + s)  # Llama 3.1: factor 8, low 1, high 4, L0 8192
        >>> llama3_rope_scaling_from_factors(r, rope_base=500000.0, head_dim=128)
        RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
    """
    r_J = np.asarray(factors_J, np.float64)
    if r_J.shape != (head_dim // 2,):
        raise ValueError(
            f"rope frequency factors: expected {head_dim // 2} values (head_dim / 2), got "
            f"shape {r_J.shape}"
        )
    if not np.all(np.isfinite(r_J)) or r_J.min() < 1 - 1e-6:
        raise ValueError("rope frequency factors: expected finite values >= 1")
    factor = float(r_J.max())
    if factor <= 1 + 1e-6:
        return None
    inv_J = rope_base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    between_J = (r_J > 1 + 1e-4) & (r_J < factor * (1 - 1e-4))
    if between_J.sum() < 2:
        raise ValueError(
            f"rope frequency factors: {int(between_J.sum())} interpolated frequencies, need 2 "
            "to recover Llama 3.1's low_freq_factor, high_freq_factor and original length"
        )
    s = (1 / r_J[between_J] - 1 / factor) / (1 - 1 / factor)
    alpha, beta = np.polyfit(inv_J[between_J] / (2 * math.pi), s, 1)
    if not (alpha > 0 and beta < 0):
        raise ValueError("rope frequency factors: they do not fall with the wavelength")
    original = max(1, round(-alpha / beta))
    low = -beta * original / alpha
    high = low + original / alpha
    return RopeScaling(
        factor=round(factor, 4),
        low_freq_factor=round(float(low), 4),
        high_freq_factor=round(float(high), 4),
        original_max_position_embeddings=int(original),
    )


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
