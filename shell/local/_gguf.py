"""GGUF files (llama.cpp's format) as Hugging Face-named float32 tensors and an HF-style config.

`read_gguf` opens a file (with `shell.local._gguf_file`, a fast reader of the container),
builds the `config.json`-style dict its metadata describes (`gguf_hf_config`) and, on demand, dequantises every tensor with
`gguf.quants.dequantize` and renames it to the Hugging Face state-dict name
(`gguf_hf_tensors`), so a GGUF and a Hugging Face directory load through the same
`rlpure.model.config_from_hf` / `params_from_hf`.

Conventions:
- Architectures: `general.architecture` `llama`, `qwen2` or `qwen3` (what `rlpure.model`
  implements); metadata keys are read under that prefix (`llama.block_count`, ...).
- Tensor names: llama.cpp's `token_embd`, `blk.{i}.attn_{q,k,v,output}`, `blk.{i}.attn_norm`,
  `blk.{i}.attn_{q,k}_norm` (Qwen3), `blk.{i}.ffn_{norm,gate,up,down}`, `output_norm`,
  `output` map to `model.embed_tokens`, `model.layers.{i}.self_attn.{q,k,v,o}_proj`, ...,
  `model.norm`, `lm_head` (`.weight` / `.bias` kept). No `output` tensor means tied
  embeddings.
- Layout: GGUF lists a tensor's dimensions fastest-first (`ne0` = columns); the reader's
  arrays are row-major `[rows, ...]`, so a dequantised matrix is Hugging Face's
  `[out, in]` as is.
- RoPE row permutation: llama.cpp rotates interleaved channel pairs `(2j, 2j+1)` of a Llama
  head, Hugging Face rotates the halves `(j, j + C/2)` (`rotate_half`), so llama.cpp's
  converter permutes the rows of Llama's `q_proj` (per query head) and `k_proj` (per key/value
  head) weights and biases. `unpermute_rope_rows` inverts `permute_rope_rows` (that converter's
  permutation) exactly; Qwen2/Qwen3 files use Hugging Face's rotation and are not permuted.
- RoPE scaling: llama.cpp writes Llama 3.1's frequency scaling as a tensor `rope_freqs.weight`
  of per-frequency divisors (no metadata field). `gguf_hf_config` recovers the `rope_scaling`
  (`rope_type: "llama3"`) they follow (`rlpure.model.llama3_rope_scaling_from_factors`) and
  checks that the model's frequencies from it equal `inv_freq_j / r_j` (relative 1e-4); the
  tensor itself is not a weight. Other scalings (`rope.scaling.type` `linear`, `yarn`) are
  refused.
- Dequantisation is whatever `gguf.quants.dequantize` supports (F32, F16, BF16, Q4_0, Q4_1,
  Q5_0, Q5_1, Q8_0, the K-quants, IQ*, ...); any other type is a `ConfigError` naming the file,
  the tensor and the type. Every other problem the caller can fix (a missing or unreadable file,
  an unsupported architecture, a missing metadata field, a tensor of the wrong shape) is a
  `ConfigError` naming the file and the field or tensor.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gguf
import msgspec
import numpy as np
from gguf import GGMLQuantizationType

from rlpure import model as model_lib
from shell.errors import ConfigError
from shell.local._gguf_file import GGUFFile, GGUFFormatError, GGUFTensor, read_gguf_file
from shell.local._hf import SUPPORTED_MODEL_TYPES, check_hf_config, check_hf_tensors

__all__ = [
    "GGUFCheckpoint",
    "gguf_hf_config",
    "gguf_hf_tensors",
    "hf_to_gguf_name",
    "open_gguf",
    "permute_rope_rows",
    "read_gguf",
    "unpermute_rope_rows",
]

_TOP_LEVEL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_TOP_NAME = re.compile(r"(\w+)\.(weight|bias)")
_HF_BLOCK_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)")
# Architectures whose q/k rows llama.cpp's converter permutes for its interleaved RoPE.
_PERMUTED_ARCHITECTURES = frozenset({"llama"})


class GGUFCheckpoint(msgspec.Struct, frozen=True, kw_only=True):
    """An opened GGUF file: its path, contents and the Hugging Face config its metadata states.

    Attributes:
        path: the file.
        hf_config: the `config.json`-style dict (`gguf_hf_config`).
        file: the parsed metadata and memory-mapped tensors (kept: the tokenizer is built
            from the same metadata).
    """

    path: Path
    hf_config: Mapping[str, Any]
    file: GGUFFile


def permute_rope_rows(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Hugging Face q/k rows → llama.cpp's order (what `convert_hf_to_gguf` does to Llama).

    Within each head of `C` rows, row `p * (C/2) + j` (half `p`, pair `j`) moves to row
    `2j + p`, so the RoPE pair `(j, j + C/2)` becomes the adjacent pair `(2j, 2j + 1)`.

    Args:
        weight: `[n_heads * C, ...]` (a q/k projection weight `[out, in]` or bias `[out]`).
        n_heads: heads along the first axis (query heads for q, key/value heads for k).

    Returns:
        The permuted array, same shape.
    """
    rows = weight.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"permute_rope_rows: {rows} rows do not split into {n_heads} even heads")
    return (
        weight.reshape(n_heads, 2, rows // n_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def unpermute_rope_rows(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """The inverse of `permute_rope_rows`: llama.cpp's q/k rows → Hugging Face's order.

    Args:
        weight: `[n_heads * C, ...]` in llama.cpp's order.
        n_heads: heads along the first axis.

    Returns:
        The array in Hugging Face order, same shape.

    Examples:
        >>> w = np.arange(8.0)
        >>> permute_rope_rows(w, 1).tolist()
        [0.0, 4.0, 1.0, 5.0, 2.0, 6.0, 3.0, 7.0]
        >>> unpermute_rope_rows(permute_rope_rows(w, 1), 1).tolist() == w.tolist()
        True
    """
    rows = weight.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"unpermute_rope_rows: {rows} rows do not split into {n_heads} even heads")
    return (
        weight.reshape(n_heads, rows // n_heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def gguf_to_hf_name(name: str) -> str | None:
    """The Hugging Face name of a llama.cpp tensor name, or None if it has none here."""
    if match := _BLOCK_NAME.fullmatch(name):
        layer, part, kind = match.groups()
        hf = _BLOCK.get(part)
        return None if hf is None else f"model.layers.{layer}.{hf}.{kind}"
    if match := _TOP_NAME.fullmatch(name):
        part, kind = match.groups()
        hf = _TOP_LEVEL.get(part)
        return None if hf is None else f"{hf}.{kind}"
    return None


def hf_to_gguf_name(name: str) -> str:
    """The llama.cpp name of a Hugging Face tensor name (the inverse of the loader's renaming).

    Raises:
        ValueError: a name with no llama.cpp counterpart.
    """
    if match := _HF_BLOCK_NAME.fullmatch(name):
        layer, part, kind = match.groups()
        for gguf_part, hf_part in _BLOCK.items():
            if hf_part == part:
                return f"blk.{layer}.{gguf_part}.{kind}"
    for gguf_part, hf_part in _TOP_LEVEL.items():
        if name in (f"{hf_part}.weight", f"{hf_part}.bias"):
            return f"{gguf_part}.{name.rsplit('.', 1)[1]}"
    raise ValueError(f"hf_to_gguf_name: no llama.cpp name for {name!r}")


def open_gguf(path: Path) -> GGUFFile:
    """Open a GGUF file (metadata parsed; tensors memory-mapped, read lazily).

    Raises:
        ConfigError: the file is missing or is not a readable GGUF file.
    """
    if not path.is_file():
        raise ConfigError(f"{path}: no such GGUF file")
    try:
        return read_gguf_file(path)
    except (GGUFFormatError, OSError) as error:
        raise ConfigError(f"{path}: not a readable GGUF file ({error})") from None


def _field(
    file: GGUFFile, key: str, path: Path, *, default: Any = None, required: bool = True
) -> Any:
    if key not in file.fields:
        if required and default is None:
            raise ConfigError(f"{path}: GGUF metadata field {key!r} is missing")
        return default
    return file.fields[key]


def _int_field(file: GGUFFile, key: str, path: Path, *, default: int | None = None) -> int:
    value = _field(file, key, path, default=default)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ConfigError(
            f"{path}: GGUF metadata field {key!r} must be a positive integer, got {value!r}"
        )
    return int(value)


def _float_field(file: GGUFFile, key: str, path: Path, *, default: float | None = None) -> float:
    value = _field(file, key, path, default=default)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ConfigError(f"{path}: GGUF metadata field {key!r} must be a number, got {value!r}")
    # Metadata floats are float32: 1e-5 is stored as 9.99999974e-06. The shortest float32
    # repr gives back the value the original config.json held.
    return float(str(np.float32(value)))


def gguf_hf_config(file: GGUFFile, path: Path) -> dict[str, Any]:
    """The Hugging Face `config.json` dict a GGUF file's metadata describes.

    Reads `general.architecture` and, under its prefix (`llama.` below): `block_count`,
    `embedding_length`, `feed_forward_length`, `attention.head_count`,
    `attention.head_count_kv` (default: `head_count`), `attention.key_length` (default:
    width / heads), `attention.layer_norm_rms_epsilon`, `rope.freq_base` (default 1e4),
    `context_length`, `vocab_size` (default: the tokenizer's or embedding's size); tied
    embeddings when the file has no `output.weight`; `bos_token_id` / `eos_token_id` from
    `tokenizer.ggml.*`; `rope_scaling` from a `rope_freqs.weight` tensor (module docstring).

    Args:
        file: the opened file (`open_gguf`).
        path: the file, named in errors.

    Returns:
        A config accepted by `shell.local._hf.check_hf_config` (transformers-4 layout:
        `rope_theta` at the top level).

    Raises:
        ConfigError: unsupported architecture, a missing or malformed field, partial rotary
            embeddings, a RoPE scaling other than Llama 3.1's, or a `rope_freqs.weight` that
            follows no Llama 3.1 curve, each naming the file and the field or tensor.
    """
    arch = _gguf_architecture(file, path)
    names = {tensor.name: tensor for tensor in file.tensors}
    if "token_embd.weight" not in names:
        raise ConfigError(f"{path}: no tensor 'token_embd.weight'")
    width = _int_field(file, f"{arch}.embedding_length", path)
    heads = _int_field(file, f"{arch}.attention.head_count", path)
    kv_heads = _int_field(file, f"{arch}.attention.head_count_kv", path, default=heads)
    head_dim = _int_field(
        file,
        f"{arch}.attention.key_length",
        path,
        default=width // heads if width >= heads else None,
    )
    _check_full_unscaled_rope(file, arch, path, head_dim=head_dim)
    embed_rows = int(names["token_embd.weight"].shape[-1])
    tokens = file.fields.get("tokenizer.ggml.tokens")
    default_vocab = len(tokens) if isinstance(tokens, list) else embed_rows
    config: dict[str, Any] = {
        "architectures": [SUPPORTED_MODEL_TYPES[arch]],
        "model_type": arch,
        "vocab_size": _int_field(file, f"{arch}.vocab_size", path, default=default_vocab),
        "hidden_size": width,
        "intermediate_size": _int_field(file, f"{arch}.feed_forward_length", path),
        "num_hidden_layers": _int_field(file, f"{arch}.block_count", path),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": _float_field(file, f"{arch}.attention.layer_norm_rms_epsilon", path),
        "rope_theta": _float_field(file, f"{arch}.rope.freq_base", path, default=10000.0),
        "max_position_embeddings": _int_field(file, f"{arch}.context_length", path),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": arch == "qwen2",
        "torch_dtype": "float32",
    }
    for name in ("bos_token_id", "eos_token_id"):
        value = _field(file, f"tokenizer.ggml.{name}", path, required=False)
        if value is not None:
            config[name] = int(value)
    check_hf_config(config, source=str(path))
    if _ROPE_FREQS in names:
        rope_scaling = _llama3_rope_scaling(names[_ROPE_FREQS], config, path)
        if rope_scaling is not None:
            config["rope_scaling"] = rope_scaling
    return config


def _gguf_architecture(file: GGUFFile, path: Path) -> str:
    """The file's `general.architecture`, checked to be one `rlpure.model` implements."""
    arch = _field(file, "general.architecture", path)
    if arch not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"{path}: GGUF metadata field 'general.architecture' is {arch!r}; supported: "
            f"{', '.join(sorted(SUPPORTED_MODEL_TYPES))}"
        )
    return str(arch)


def _check_full_unscaled_rope(file: GGUFFile, arch: str, path: Path, *, head_dim: int) -> None:
    """Refuses partial rotary embeddings and RoPE scalings named in metadata (module docstring)."""
    rope_dims = _int_field(file, f"{arch}.rope.dimension_count", path, default=head_dim)
    if rope_dims != head_dim:
        raise ConfigError(
            f"{path}: GGUF metadata field '{arch}.rope.dimension_count' is {rope_dims}, not the "
            f"head width {head_dim}; partial rotary embeddings are not supported"
        )
    scaling = _field(file, f"{arch}.rope.scaling.type", path, required=False)
    if scaling not in (None, "none"):
        raise ConfigError(
            f"{path}: GGUF RoPE scaling '{arch}.rope.scaling.type' = {scaling!r} is not read "
            "from GGUF (only Llama 3.1's, as a 'rope_freqs.weight' tensor); load the Hugging "
            "Face checkpoint directory instead"
        )


_ROPE_FREQS = "rope_freqs.weight"


def _llama3_rope_scaling(
    tensor: GGUFTensor, config: Mapping[str, Any], path: Path
) -> dict[str, Any] | None:
    """The `rope_scaling` dict (`rope_type: "llama3"`) a `rope_freqs.weight` tensor follows, or
    None when its divisors are all 1; checked against the divisors themselves."""
    factors_J = _dequantize(tensor, path).reshape(-1).astype(np.float64)
    head_dim, theta = int(config["head_dim"]), float(config["rope_theta"])
    try:
        scaling = model_lib.llama3_rope_scaling_from_factors(
            factors_J, rope_base=theta, head_dim=head_dim
        )
    except ValueError as error:
        raise ConfigError(f"{path}: tensor {_ROPE_FREQS!r}: {error}") from None
    if scaling is None:
        return None
    rope_scaling = {"rope_type": "llama3", **msgspec.structs.asdict(scaling)}
    got_J = model_lib.rope_inv_freq(
        model_lib.config_from_hf({**config, "rope_scaling": rope_scaling})
    ).astype(np.float64)
    want_J = model_lib.rope_inv_freq(model_lib.config_from_hf(config)) / factors_J
    off = float(np.max(np.abs(got_J / want_J - 1)))
    if off > 1e-4:
        raise ConfigError(
            f"{path}: tensor {_ROPE_FREQS!r} does not follow Llama 3.1's RoPE scaling (the "
            f"closest, {scaling}, is off by {off:.1e} relative); load the Hugging Face "
            "checkpoint directory instead"
        )
    return rope_scaling


def _metadata_keys(arch: str) -> dict[str, str]:
    """`config.json` field → the GGUF metadata key it is read from (for messages)."""
    return {
        "vocab_size": f"{arch}.vocab_size",
        "hidden_size": f"{arch}.embedding_length",
        "intermediate_size": f"{arch}.feed_forward_length",
        "num_attention_heads": f"{arch}.attention.head_count",
        "num_key_value_heads": f"{arch}.attention.head_count_kv",
        "head_dim": f"{arch}.attention.key_length",
    }


def read_gguf(path: Path) -> GGUFCheckpoint:
    """Open a GGUF file and build its Hugging Face config (tensors are not read yet).

    Args:
        path: the `.gguf` file.

    Returns:
        The `GGUFCheckpoint`; `gguf_hf_tensors(checkpoint)` dequantises its tensors.

    Raises:
        ConfigError: see `open_gguf` and `gguf_hf_config`.
    """
    path = Path(path)
    file = open_gguf(path)
    return GGUFCheckpoint(path=path, hf_config=gguf_hf_config(file, path), file=file)


def _dequantize(tensor: GGUFTensor, path: Path) -> np.ndarray:
    qtype = GGMLQuantizationType(tensor.tensor_type)
    try:
        values = gguf.quants.dequantize(np.asarray(tensor.data), qtype)
    except NotImplementedError:
        raise ConfigError(
            f"{path}: tensor {tensor.name!r} has GGML type {qtype.name}, which gguf "
            f"{_gguf_version()} cannot dequantise"
        ) from None
    shape = tuple(int(n) for n in reversed(tensor.shape))
    return np.ascontiguousarray(values, dtype=np.float32).reshape(shape)


def _gguf_version() -> str:
    from importlib.metadata import version

    return version("gguf")


def gguf_hf_tensors(checkpoint: GGUFCheckpoint) -> dict[str, np.ndarray]:
    """Dequantise a GGUF file's tensors to float32 under their Hugging Face names and layouts.

    Llama q/k projection rows are put back in Hugging Face's order (`unpermute_rope_rows`). The
    result is checked against `checkpoint.hf_config` (`shell.local._hf.check_hf_tensors`).

    Args:
        checkpoint: from `read_gguf`.

    Returns:
        Hugging Face name → float32 array (no `lm_head.weight` when embeddings are tied).

    Raises:
        ConfigError: a tensor with no Hugging Face name, a GGML type `gguf` cannot
            dequantise, or a shape that does not fit the metadata (naming file and tensor).
    """
    path, config, file = checkpoint.path, checkpoint.hf_config, checkpoint.file
    permuted = config["model_type"] in _PERMUTED_ARCHITECTURES
    heads_of = {
        "self_attn.q_proj": int(config["num_attention_heads"]),
        "self_attn.k_proj": int(config["num_key_value_heads"]),
    }
    tensors: dict[str, np.ndarray] = {}
    for tensor in file.tensors:
        if tensor.name == _ROPE_FREQS:  # RoPE scaling, read into the config (`gguf_hf_config`)
            continue
        name = gguf_to_hf_name(tensor.name)
        if name is None:
            raise ConfigError(
                f"{path}: tensor {tensor.name!r} has no Hugging Face counterpart for "
                f"architecture {config['model_type']!r}"
            )
        values = _dequantize(tensor, path)
        if permuted:
            projection = name.rsplit(".", 1)[0].split(".", 3)[-1]
            n_heads = heads_of.get(projection)
            if n_heads is not None:
                if values.shape[0] % (2 * n_heads):
                    raise ConfigError(
                        f"{path}: tensor {tensor.name!r} has {values.shape[0]} rows, not a "
                        f"multiple of 2 × {n_heads} heads (GGUF metadata head counts)"
                    )
                values = unpermute_rope_rows(values, n_heads)
        tensors[name] = values
    check_hf_tensors(
        config,
        {name: array.shape for name, array in tensors.items()},
        source=str(path),
        config_source=f"{path} (metadata)",
        field_names=_metadata_keys(str(config["model_type"])),
    )
    return tensors
