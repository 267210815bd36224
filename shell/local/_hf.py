"""Hugging Face checkpoint directories: `config.json` and `*.safetensors` weights as numpy.

A checkpoint directory (what `huggingface_hub.snapshot_download` leaves, or `save_pretrained`
writes) holds `config.json`, the weights as one `model.safetensors` or as shards listed by
`model.safetensors.index.json`, and tokenizer files (read by `shell.local._hf_tokenizer`).

Conventions:
- Tensors keep their Hugging Face state-dict names (`model.layers.0.self_attn.q_proj.weight`)
  and layouts (`nn.Linear` weights are `[out, in]`); `rlpure.model.params_from_hf` maps them to
  the pure model's params. Every tensor is returned as float32 numpy, whatever its stored dtype
  (bfloat16 through `ml_dtypes`, which `safetensors`' numpy reader uses).
- The families read are those `rlpure.model` implements: `LlamaForCausalLM` (`llama`),
  `Qwen2ForCausalLM` (`qwen2`, q/k/v biases) and `Qwen3ForCausalLM` (`qwen3`, q/k RMSNorm).
  `expected_hf_shapes` states, per tensor, the shape a config implies and the config fields
  that imply it, so a weight that does not fit its config is refused naming the file, the
  tensor and the fields (`check_hf_tensors`); GGUF loading (`shell.local._gguf`) runs the same
  check on the tensors it converts.
- Every failure the caller can fix (a missing or malformed file, an unsupported architecture, a
  shape mismatch) is a `ConfigError` whose message names the file and the field or tensor.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import safetensors
from safetensors import SafetensorError

from shell.errors import ConfigError

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "ExpectedShape",
    "check_hf_config",
    "check_hf_tensors",
    "expected_hf_shapes",
    "hf_weight_files",
    "read_hf_config",
    "read_hf_tensors",
]

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

# model_type -> the architecture class name Hugging Face writes in `architectures`.
SUPPORTED_MODEL_TYPES: Mapping[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}

# Buffers some older checkpoints save; they are recomputed, never read.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class ExpectedShape(NamedTuple):
    """The shape a config implies for one tensor, and the config fields that imply it."""

    shape: tuple[int, ...]
    fields: str


def read_hf_config(directory: Path) -> dict[str, Any]:
    """Read and check `config.json` of a checkpoint directory.

    Args:
        directory: the checkpoint directory.

    Returns:
        The parsed config (a JSON object), checked by `check_hf_config`.

    Raises:
        ConfigError: the file is missing, is not JSON, is not an object, or fails
            `check_hf_config` (the message names the file and the field).
    """
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"{directory}: no {CONFIG_FILE}; not a Hugging Face checkpoint directory")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: malformed JSON ({error})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(config).__name__}")
    check_hf_config(config, source=str(path))
    return config


def _positive_int(config: Mapping[str, Any], field: str, source: str) -> int:
    value = config.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{source}: field {field!r} must be a positive integer, got {value!r}")
    return value


def check_hf_config(config: Mapping[str, Any], *, source: str) -> None:
    """Check that a Hugging Face config describes a supported architecture with sane sizes.

    Args:
        config: a `config.json` object (or one built from GGUF metadata).
        source: what to name in errors (a file path).

    Raises:
        ConfigError: `model_type` is not one of `SUPPORTED_MODEL_TYPES`, `architectures`
            names another class, a size field is missing or not a positive integer, or the
            head counts do not divide.
    """
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"{source}: field 'model_type' is {model_type!r}; supported architectures: "
            + ", ".join(f"{name} ({kind})" for kind, name in SUPPORTED_MODEL_TYPES.items())
        )
    architectures = config.get("architectures")
    expected = SUPPORTED_MODEL_TYPES[str(model_type)]
    if architectures is not None and architectures != [expected]:
        raise ConfigError(
            f"{source}: field 'architectures' is {architectures!r}; only [{expected!r}] is "
            f"supported for model_type {model_type!r}"
        )
    for field in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
    ):
        _positive_int(config, field, source)
    heads = config["num_attention_heads"]
    kv_heads = _kv_heads(config, source)
    if heads % kv_heads:
        raise ConfigError(
            f"{source}: field 'num_key_value_heads' ({kv_heads}) must divide "
            f"'num_attention_heads' ({heads})"
        )
    if config.get("head_dim") is None and config["hidden_size"] % heads:
        raise ConfigError(
            f"{source}: field 'num_attention_heads' ({heads}) must divide 'hidden_size' "
            f"({config['hidden_size']}) when 'head_dim' is absent"
        )
    _head_dim(config, source)
    if config.get("mlp_bias"):
        raise ConfigError(f"{source}: field 'mlp_bias' is true; MLP biases are not supported")


def _kv_heads(config: Mapping[str, Any], source: str) -> int:
    if config.get("num_key_value_heads") is None:
        return int(config["num_attention_heads"])
    return _positive_int(config, "num_key_value_heads", source)


def _head_dim(config: Mapping[str, Any], source: str) -> int:
    if config.get("head_dim") is None:
        return int(config["hidden_size"]) // int(config["num_attention_heads"])
    return _positive_int(config, "head_dim", source)


def _has_attention_bias(config: Mapping[str, Any]) -> tuple[bool, bool]:
    """(q/k/v biases, o_proj bias): Qwen2 always has the first; Llama's `attention_bias` both."""
    if config["model_type"] == "qwen2":
        return True, False
    if config["model_type"] == "llama" and config.get("attention_bias"):
        return True, True
    return False, False


def expected_hf_shapes(
    config: Mapping[str, Any], *, source: str = CONFIG_FILE
) -> dict[str, ExpectedShape]:
    """Every tensor a supported config implies, by Hugging Face name, with its shape.

    Args:
        config: a config accepted by `check_hf_config`.
        source: what to name in errors.

    Returns:
        Name → `ExpectedShape`; `lm_head.weight` only when `tie_word_embeddings` is false.

    Examples:
        >>> cfg = {"model_type": "llama", "vocab_size": 10, "hidden_size": 4,
        ...        "intermediate_size": 6, "num_hidden_layers": 1, "num_attention_heads": 2,
        ...        "num_key_value_heads": 1, "tie_word_embeddings": True}
        >>> expected_hf_shapes(cfg)["model.layers.0.self_attn.k_proj.weight"].shape
        (2, 4)
    """
    check_hf_config(config, source=source)
    vocab, width = int(config["vocab_size"]), int(config["hidden_size"])
    ffn, layers = int(config["intermediate_size"]), int(config["num_hidden_layers"])
    heads, kv_heads, head_dim = (
        int(config["num_attention_heads"]),
        _kv_heads(config, source),
        _head_dim(config, source),
    )
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    q_fields = "num_attention_heads × head_dim, hidden_size"
    kv_fields = "num_key_value_heads × head_dim, hidden_size"
    qkv_bias, o_bias = _has_attention_bias(config)
    shapes = {
        "model.embed_tokens.weight": ExpectedShape((vocab, width), "vocab_size, hidden_size"),
        "model.norm.weight": ExpectedShape((width,), "hidden_size"),
    }
    if not config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = ExpectedShape((vocab, width), "vocab_size, hidden_size")
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": ExpectedShape((width,), "hidden_size"),
            p + "post_attention_layernorm.weight": ExpectedShape((width,), "hidden_size"),
            p + "self_attn.q_proj.weight": ExpectedShape((q_width, width), q_fields),
            p + "self_attn.k_proj.weight": ExpectedShape((kv_width, width), kv_fields),
            p + "self_attn.v_proj.weight": ExpectedShape((kv_width, width), kv_fields),
            p + "self_attn.o_proj.weight": ExpectedShape(
                (width, q_width), "hidden_size, num_attention_heads × head_dim"
            ),
            p + "mlp.gate_proj.weight": ExpectedShape(
                (ffn, width), "intermediate_size, hidden_size"
            ),
            p + "mlp.up_proj.weight": ExpectedShape((ffn, width), "intermediate_size, hidden_size"),
            p + "mlp.down_proj.weight": ExpectedShape(
                (width, ffn), "hidden_size, intermediate_size"
            ),
        }
        if qkv_bias:
            shapes |= {
                p + "self_attn.q_proj.bias": ExpectedShape((q_width,), "num_attention_heads"),
                p + "self_attn.k_proj.bias": ExpectedShape((kv_width,), "num_key_value_heads"),
                p + "self_attn.v_proj.bias": ExpectedShape((kv_width,), "num_key_value_heads"),
            }
        if o_bias:
            shapes[p + "self_attn.o_proj.bias"] = ExpectedShape((width,), "hidden_size")
        if config["model_type"] == "qwen3":
            shapes |= {
                p + "self_attn.q_norm.weight": ExpectedShape((head_dim,), "head_dim"),
                p + "self_attn.k_norm.weight": ExpectedShape((head_dim,), "head_dim"),
            }
    return shapes


def check_hf_tensors(
    config: Mapping[str, Any],
    shapes: Mapping[str, tuple[int, ...]],
    *,
    source: Mapping[str, str] | str,
    config_source: str = CONFIG_FILE,
    field_names: Mapping[str, str] | None = None,
) -> None:
    """Check tensor names and shapes against what a config implies.

    Args:
        config: a config accepted by `check_hf_config`.
        shapes: tensor name → its shape (a tied `lm_head.weight` and ignorable buffers such as
            `rotary_emb.inv_freq` are allowed in addition to the expected names).
        source: the file holding each tensor (name → file), or one file for all.
        config_source: the config file to name in shape errors.
        field_names: how `config_source` spells each config field, when not as
            `config.json` does (GGUF metadata keys), for the messages.

    Raises:
        ConfigError: a tensor is missing, unexpected, or of the wrong shape (the message names
            the file, the tensor and the config fields that imply its shape).
    """
    expected = expected_hf_shapes(config, source=config_source)

    def file_of(name: str) -> str:
        return source if isinstance(source, str) else source.get(name, "?")

    missing = sorted(set(expected) - set(shapes), key=_natural_key)
    if missing:
        files = sorted({source} if isinstance(source, str) else set(source.values()))
        shown = ", ".join(missing[:5]) + (
            f", ... ({len(missing)} in all)" if len(missing) > 5 else ""
        )
        raise ConfigError(
            f"{', '.join(files)}: missing tensors {shown} that {config_source} "
            f"(model_type {config['model_type']!r}) implies"
        )
    tied = bool(config.get("tie_word_embeddings", False))
    for name, shape in shapes.items():
        if name.endswith(_IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
            continue
        if name not in expected:
            raise ConfigError(
                f"{file_of(name)}: unexpected tensor {name!r} for model_type "
                f"{config['model_type']!r} ({config_source})"
            )
        want = expected[name]
        if tuple(shape) != want.shape:
            fields = want.fields
            for field, spelled in (field_names or {}).items():
                fields = re.sub(rf"\b{field}\b", spelled, fields)
            raise ConfigError(
                f"{file_of(name)}: tensor {name!r} has shape {tuple(shape)}, but {config_source} "
                f"implies {want.shape} ({fields})"
            )
    if tied and "lm_head.weight" in shapes:
        want = expected["model.embed_tokens.weight"]
        if tuple(shapes["lm_head.weight"]) != want.shape:
            raise ConfigError(
                f"{file_of('lm_head.weight')}: tensor 'lm_head.weight' has shape "
                f"{tuple(shapes['lm_head.weight'])}, but {config_source} implies {want.shape}"
            )


def _natural_key(name: str) -> tuple[Any, ...]:
    return tuple(int(part) if part.isdigit() else part for part in name.split("."))


def hf_weight_files(directory: Path) -> dict[str, Path]:
    """Which safetensors file holds each tensor of a checkpoint directory.

    With `model.safetensors.index.json`, its `weight_map`; else `model.safetensors`; else every
    `*.safetensors` file in the directory (their tensors read from their headers).

    Args:
        directory: the checkpoint directory.

    Returns:
        Tensor name → the file holding it.

    Raises:
        ConfigError: no safetensors weights, a malformed index, an index naming a missing
            shard, or a shard whose header cannot be read (each naming the file).
    """
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as error:
            raise ConfigError(f"{index}: malformed index, no 'weight_map' ({error!r})") from None
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
        ):
            raise ConfigError(f"{index}: field 'weight_map' must map tensor names to file names")
        files = {name: directory / shard for name, shard in weight_map.items()}
        for shard in sorted(set(files.values())):
            if not shard.is_file():
                raise ConfigError(f"{index}: shard {shard.name!r} is missing from {directory}")
        return files
    shards = [directory / SINGLE_FILE] if (directory / SINGLE_FILE).is_file() else []
    shards = shards or sorted(directory.glob("*.safetensors"))
    if not shards:
        bins = sorted(p.name for p in directory.glob("*.bin"))
        hint = f" (found {', '.join(bins)}: PyTorch pickles are not read)" if bins else ""
        raise ConfigError(f"{directory}: no {SINGLE_FILE}, {INDEX_FILE} or *.safetensors{hint}")
    files = {}
    for shard in shards:
        for name in _safetensors_keys(shard):
            if name in files:  # without an index nothing says which copy is meant
                raise ConfigError(
                    f"{directory}: tensor {name!r} is in both {files[name].name} and "
                    f"{shard.name}, and there is no {INDEX_FILE} to say which one to read"
                )
            files[name] = shard
    return files


def _safetensors_keys(path: Path) -> list[str]:
    try:
        with safetensors.safe_open(str(path), framework="np") as handle:
            return list(handle.keys())
    except (SafetensorError, OSError) as error:
        raise ConfigError(f"{path}: not a readable safetensors file ({error})") from None


def _read_shard(path: Path, names: Iterable[str]) -> dict[str, np.ndarray]:
    tensors = {}
    try:
        with safetensors.safe_open(str(path), framework="np") as handle:
            present = set(handle.keys())
            for name in names:
                if name not in present:
                    raise ConfigError(
                        f"{path}: the index lists tensor {name!r} but the shard lacks it"
                    )
                tensors[name] = np.asarray(handle.get_tensor(name), dtype=np.float32)
    except (SafetensorError, OSError) as error:
        raise ConfigError(f"{path}: not a readable safetensors file ({error})") from None
    return tensors


def read_hf_tensors(directory: Path, config: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Read a checkpoint directory's weights as float32 numpy, checked against its config.

    Args:
        directory: the checkpoint directory.
        config: its config (`read_hf_config`).

    Returns:
        Hugging Face name → float32 array in Hugging Face layout; ignorable buffers and a tied
        `lm_head.weight` are dropped.

    Raises:
        ConfigError: see `hf_weight_files` and `check_hf_tensors`.
    """
    files = hf_weight_files(directory)
    by_shard: dict[Path, list[str]] = {}
    for name, shard in files.items():
        by_shard.setdefault(shard, []).append(name)
    tensors: dict[str, np.ndarray] = {}
    for shard, names in by_shard.items():
        tensors |= _read_shard(shard, names)
    check_hf_tensors(
        config,
        {name: array.shape for name, array in tensors.items()},
        source={name: str(path) for name, path in files.items()},
        config_source=str(directory / CONFIG_FILE),
    )
    tied = bool(config.get("tie_word_embeddings", False))
    return {
        name: array
        for name, array in tensors.items()
        if not name.endswith(_IGNORED_SUFFIXES) and not (tied and name == "lm_head.weight")
    }
