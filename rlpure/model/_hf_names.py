"""Hugging Face names to ours: `config_from_hf` (a `config.json` dict) and `params_from_hf`
(a state dict), for `LlamaForCausalLM`, `Qwen2ForCausalLM` and `Qwen3ForCausalLM`.

Pure: the shell (`shell.local`) reads `config.json` and the safetensors or GGUF tensors and
hands the parsed dict and the arrays here. Tensors are in Hugging Face's layout: a projection
`*.weight` is `[out_features, in_features]` (PyTorch `nn.Linear`), queries and keys in the
"rotate-half" RoPE order of Hugging Face's modelling code (a GGUF's llama.cpp-permuted Q/K
rows must be un-permuted first). Our matrices are the transposes, with the head axis split
out: `q_proj.weight` `[H·C, E]` → `wq_E_H_C`, `o_proj.weight` `[E, H·C]` → `wo_H_C_E`,
`gate_proj.weight` `[F, E]` → `w_gate_E_F`, `lm_head.weight` `[V, E]` → `unembed_E_V`.

Errors are `ValueError`s naming the config field or the tensor (with expected and actual
shapes), and listing every missing or unexpected tensor name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from rlpure.model._config import Family, ModelConfig, ParamDtype, RopeScaling

__all__ = ["HF_ARCHITECTURES", "config_from_hf", "hf_tensor_names", "params_from_hf"]

HF_ARCHITECTURES: Mapping[str, Family] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
"""The Hugging Face `architectures` entries we load, and the family each maps to."""

Params = dict[str, Any]


def _field(config: Mapping[str, Any], name: str, kind: type, default: Any = ...) -> Any:
    value = config.get(name, default)
    if value is ...:
        raise ValueError(f"config.json: missing field {name!r}")
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"config.json: field {name!r} should be {kind.__name__}, got {value!r}")
    return value


def _family(config: Mapping[str, Any]) -> Family:
    architectures = config.get("architectures")
    if architectures is None:  # a config built in code, never saved by a model: its type
        model_type = config.get("model_type")
        by_type: dict[str, Family] = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
        if model_type in by_type:
            return by_type[model_type]
        raise ValueError(
            f"config.json: missing field 'architectures' (and model_type {model_type!r} is "
            f"not llama, qwen2 or qwen3); supported: {sorted(HF_ARCHITECTURES)}"
        )
    if not isinstance(architectures, list | tuple) or len(architectures) != 1:
        raise ValueError(
            f"config.json: field 'architectures' should list one architecture, got "
            f"{architectures!r}"
        )
    family = HF_ARCHITECTURES.get(architectures[0])
    if family is None:
        raise ValueError(
            f"config.json: unsupported architectures {architectures!r}; supported: "
            f"{sorted(HF_ARCHITECTURES)}"
        )
    return family


def _rope(config: Mapping[str, Any]) -> tuple[float, RopeScaling | None]:
    """`(rope_theta, scaling)` from either `rope_theta` + `rope_scaling` (transformers 4) or
    `rope_parameters` (transformers 5)."""
    parameters = config.get("rope_parameters")
    scaling = config.get("rope_scaling")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise ValueError(
            f"config.json: field 'rope_parameters' should be a dict, got {parameters!r}"
        )
    if scaling is not None and not isinstance(scaling, Mapping):
        raise ValueError(f"config.json: field 'rope_scaling' should be a dict, got {scaling!r}")
    spec: Mapping[str, Any] = {**(scaling or {}), **(parameters or {})}
    theta = spec.get("rope_theta", config.get("rope_theta", 10_000.0))
    if isinstance(theta, bool) or not isinstance(theta, int | float):
        raise ValueError(f"config.json: field 'rope_theta' should be a number, got {theta!r}")
    rope_type = spec.get("rope_type", spec.get("type", "default"))
    where = "rope_parameters" if parameters is not None else "rope_scaling"
    if spec.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("config.json: field 'partial_rotary_factor' other than 1 is unsupported")
    if rope_type == "default":
        return float(theta), None
    if rope_type != "llama3":
        raise ValueError(
            f"config.json: field {where!r} has unsupported rope_type {rope_type!r}; supported: "
            "default, llama3"
        )
    original = spec.get("original_max_position_embeddings", config.get("max_position_embeddings"))
    try:
        return float(theta), RopeScaling(
            factor=float(spec["factor"]),
            low_freq_factor=float(spec["low_freq_factor"]),
            high_freq_factor=float(spec["high_freq_factor"]),
            original_max_position_embeddings=int(original),
        )
    except (KeyError, TypeError) as error:
        raise ValueError(
            f"config.json: field {where!r} (llama3) lacks or mistypes {error}; it needs factor, "
            "low_freq_factor, high_freq_factor, original_max_position_embeddings"
        ) from None


def config_from_hf(
    config: Mapping[str, Any],
    *,
    dtype: ParamDtype = "float32",
    max_seq_len: int | None = None,
) -> ModelConfig:
    """Our `ModelConfig` for a Hugging Face `config.json` (already parsed to a dict).

    Reads `architectures` (or, when it is absent, `model_type`), `hidden_size`, `num_hidden_layers`, `num_attention_heads`,
    `num_key_value_heads`, `head_dim`, `intermediate_size`, `vocab_size`,
    `max_position_embeddings`, `rms_norm_eps`, `rope_theta` / `rope_scaling` (or
    transformers 5's `rope_parameters`), `tie_word_embeddings` and `initializer_range`, and
    refuses features we do not implement (`attention_bias`/`mlp_bias` on Llama, sliding-window
    attention, a `hidden_act` other than `silu`, RoPE types other than default and llama3).

    Args:
        config: the parsed `config.json`.
        dtype: the params and matmul dtype of the result.
        max_seq_len: overrides `max_position_embeddings` (e.g. to bound memory).

    Returns:
        The `ModelConfig` (family `llama`, `qwen2` or `qwen3`).

    Raises:
        ValueError: naming the unsupported or missing field.

    Examples:
        >>> c = config_from_hf({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        ...     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        ...     "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 256})
        >>> (c.family, c.kv_heads, c.head_dim, c.tie_embeddings)
        ('llama', 2, 16, False)
    """
    family = _family(config)
    heads = _field(config, "num_attention_heads", int)
    hidden = _field(config, "hidden_size", int)
    head_dim = config.get("head_dim")
    if head_dim is not None:
        head_dim = _field(config, "head_dim", int)
        if head_dim * heads == hidden:
            head_dim = None  # the default: d_model // n_heads
    if _field(config, "hidden_act", str, "silu") != "silu":
        raise ValueError(
            f"config.json: field 'hidden_act' {config['hidden_act']!r} is unsupported (silu only)"
        )
    for flag in ("attention_bias", "mlp_bias"):
        if family == "qwen2" and flag == "attention_bias":
            continue
        if _field(config, flag, bool, False):
            raise ValueError(f"config.json: field {flag!r} = true is unsupported for {family}")
    if _field(config, "rope_interleaved", bool, False):
        raise ValueError(
            "config.json: field 'rope_interleaved' = true is unsupported (rotate-half RoPE only)"
        )
    if _field(config, "use_sliding_window", bool, False):
        raise ValueError("config.json: field 'use_sliding_window' = true is unsupported")
    layer_types = config.get("layer_types")
    if layer_types is not None and any(kind != "full_attention" for kind in layer_types):
        raise ValueError(
            "config.json: field 'layer_types' has non-full_attention layers (unsupported)"
        )
    theta, scaling = _rope(config)
    positions = _field(config, "max_position_embeddings", int)
    return ModelConfig(
        vocab_size=_field(config, "vocab_size", int),
        d_model=hidden,
        n_layers=_field(config, "num_hidden_layers", int),
        n_heads=heads,
        d_ff=_field(config, "intermediate_size", int),
        max_seq_len=max_seq_len if max_seq_len is not None else positions,
        init_std=_field(config, "initializer_range", float, 0.02),
        rope_base=theta,
        norm_eps=_field(config, "rms_norm_eps", float, 1e-6),
        family=family,
        n_kv_heads=_field(config, "num_key_value_heads", int, heads),
        head_width=head_dim,
        tie_embeddings=_field(config, "tie_word_embeddings", bool, False),
        rope_scaling=scaling,
        dtype=dtype,
    )


# --- tensors ---------------------------------------------------------------------------------

# (our per-layer name, HF name under `model.layers.{i}.`, HF shape, to-ours conversion).
_Convert = Callable[[np.ndarray, ModelConfig], np.ndarray]


def _transpose_split(*out_axes: str) -> _Convert:
    """`[prod(out), in]` → `[in, *out]`."""

    def convert(w: np.ndarray, config: ModelConfig) -> np.ndarray:
        sizes = _sizes(config)
        return w.T.reshape(w.shape[1], *(sizes[a] for a in out_axes))

    return convert


def _transpose_merge_in(*in_axes: str) -> _Convert:
    """`[out, prod(in)]` → `[*in, out]`."""

    def convert(w: np.ndarray, config: ModelConfig) -> np.ndarray:
        sizes = _sizes(config)
        return w.T.reshape(*(sizes[a] for a in in_axes), w.shape[0])

    return convert


def _split(*axes: str) -> _Convert:
    def convert(w: np.ndarray, config: ModelConfig) -> np.ndarray:
        sizes = _sizes(config)
        return w.reshape(*(sizes[a] for a in axes))

    return convert


def _same(w: np.ndarray, config: ModelConfig) -> np.ndarray:
    return w


def _sizes(config: ModelConfig) -> dict[str, int]:
    return {
        "E": config.d_model,
        "H": config.n_heads,
        "N": config.kv_heads,
        "C": config.head_dim,
        "F": config.d_ff,
        "V": config.vocab_size,
    }


def _layer_table(config: ModelConfig) -> list[tuple[str, str, tuple[int, ...], _Convert]]:
    e, h, n, c, f = (
        config.d_model,
        config.n_heads,
        config.kv_heads,
        config.head_dim,
        config.d_ff,
    )
    table: list[tuple[str, str, tuple[int, ...], _Convert]] = [
        ("attn_norm_scale_E", "input_layernorm.weight", (e,), _same),
        ("wq_E_H_C", "self_attn.q_proj.weight", (h * c, e), _transpose_split("H", "C")),
        ("wk_E_N_C", "self_attn.k_proj.weight", (n * c, e), _transpose_split("N", "C")),
        ("wv_E_N_C", "self_attn.v_proj.weight", (n * c, e), _transpose_split("N", "C")),
        ("wo_H_C_E", "self_attn.o_proj.weight", (e, h * c), _transpose_merge_in("H", "C")),
        ("mlp_norm_scale_E", "post_attention_layernorm.weight", (e,), _same),
        ("w_gate_E_F", "mlp.gate_proj.weight", (f, e), _transpose_split("F")),
        ("w_up_E_F", "mlp.up_proj.weight", (f, e), _transpose_split("F")),
        ("w_down_F_E", "mlp.down_proj.weight", (e, f), _transpose_split("E")),
    ]
    if config.family == "qwen2":
        table += [
            ("bq_H_C", "self_attn.q_proj.bias", (h * c,), _split("H", "C")),
            ("bk_N_C", "self_attn.k_proj.bias", (n * c,), _split("N", "C")),
            ("bv_N_C", "self_attn.v_proj.bias", (n * c,), _split("N", "C")),
        ]
    if config.family == "qwen3":
        table += [
            ("q_norm_scale_C", "self_attn.q_norm.weight", (c,), _same),
            ("k_norm_scale_C", "self_attn.k_norm.weight", (c,), _same),
        ]
    return table


def hf_tensor_names(config: ModelConfig) -> list[str]:
    """Every Hugging Face state-dict name `params_from_hf` needs for `config`."""
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not config.tie_embeddings:
        names.append("lm_head.weight")
    for i in range(config.n_layers):
        names += [f"model.layers.{i}.{hf}" for _, hf, _, _ in _layer_table(config)]
    return names


def _ignorable(name: str) -> bool:
    """Buffers some checkpoints save that carry no weights (RoPE tables)."""
    return name.endswith("rotary_emb.inv_freq")


def params_from_hf(config: ModelConfig, tensors: Mapping[str, Any]) -> Params:
    """Our params pytree from a Hugging Face state dict (`name → array`).

    Args:
        config: from `config_from_hf` (family llama, qwen2 or qwen3).
        tensors: every tensor of the checkpoint, Hugging Face names and layout (numpy arrays
            or anything `np.asarray` takes, any float dtype). For a tied model a
            `lm_head.weight` is accepted and ignored.

    Returns:
        The params (JAX arrays in `config.dtype`, names in `rlpure.model._transformer`).

    Raises:
        ValueError: listing missing and unexpected tensor names, or naming a tensor whose
            shape differs from the config's (`expected (..), got (..)`).
    """
    if config.family == "rlpure":
        raise ValueError("params_from_hf: config.family 'rlpure' has no Hugging Face layout")
    expected = set(hf_tensor_names(config))
    allowed_extra = {"lm_head.weight"} if config.tie_embeddings else set()
    missing = sorted(expected - set(tensors))
    unexpected = sorted(
        name
        for name in tensors
        if name not in expected and name not in allowed_extra and not _ignorable(name)
    )
    if missing or unexpected:
        raise ValueError(
            f"params_from_hf: checkpoint does not match the {config.family} config "
            f"({config.n_layers} layers): missing tensors {missing[:20]}"
            f"{' …' if len(missing) > 20 else ''}, unexpected tensors {unexpected[:20]}"
            f"{' …' if len(unexpected) > 20 else ''}"
        )
    dtype = jnp.bfloat16 if config.dtype == "bfloat16" else jnp.float32

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        array = np.asarray(tensors[name], np.float32)
        if array.shape != shape:
            raise ValueError(
                f"params_from_hf: tensor {name}: expected shape {shape}, got {array.shape}"
            )
        return array

    e, v = config.d_model, config.vocab_size
    layers: Params = {}
    for ours, hf, shape, convert in _layer_table(config):
        stacked = np.stack(
            [convert(get(f"model.layers.{i}.{hf}", shape), config) for i in range(config.n_layers)]
        )
        layers[ours] = jnp.asarray(stacked, dtype)
    params: Params = {
        "embed_V_E": jnp.asarray(get("model.embed_tokens.weight", (v, e)), dtype),
        "layers": layers,
        "final_norm_scale_E": jnp.asarray(get("model.norm.weight", (e,)), dtype),
    }
    if not config.tie_embeddings:
        params["unembed_E_V"] = jnp.asarray(get("lm_head.weight", (v, e)).T, dtype)
    return params
