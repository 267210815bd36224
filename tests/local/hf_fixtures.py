"""Small real checkpoints written on the fly: Hugging Face directories and GGUF files.

Random weights of a tiny Llama/Qwen2/Qwen3 config, a byte-level BPE tokenizer trained with
`tokenizers` on a few sentences (ChatML special tokens, a chat template), written the way
`save_pretrained` / `huggingface_hub` / llama.cpp's converter lay them out, so loading code is
tested on real files. Shared by the loading tests and the LoRA/backend tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import gguf
import ml_dtypes
import numpy as np
import safetensors.numpy
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from shell.local import LocalServiceClient, LocalTrainingClient
from shell.local._gguf import hf_to_gguf_name, permute_rope_rows
from shell.local._hf import expected_hf_shapes

__all__ = [
    "CHAT_TEMPLATE",
    "SAMPLE_TEXTS",
    "hf_config",
    "random_hf_tensors",
    "random_llama_trainer",
    "restoring_routes",
    "train_tokenizer",
    "write_gguf",
    "write_hf_cache_entry",
    "write_hf_directory",
]

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
USER_DEFINED = "<think>"
SAMPLE_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "What is 12 + 34? The answer is 46.",
    "  leading spaces, tabs\tand\nnew lines\n\n",
    "Unicode: café, naïve, 東京, emoji 🙂!",
    "<|im_start|>user\nhi<|im_end|>\n<think>maybe</think>",
)


def train_tokenizer(vocab_size: int = 320) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (GPT-2 style) trained on `SAMPLE_TEXTS`, ChatML specials."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(list(SAMPLE_TEXTS) * 4, trainer=trainer)
    backend.add_tokens([USER_DEFINED])
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|im_end|>",
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def hf_config(model_type: str = "llama", *, vocab_size: int, **overrides: Any) -> dict[str, Any]:
    """A tiny `config.json` (width 64, 2 layers, 4 query / 2 KV heads of 16, FFN 96)."""
    architecture = {
        "llama": "LlamaForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
    }[model_type]
    config = {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 256,
        "tie_word_embeddings": model_type != "qwen2",
        "hidden_act": "silu",
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    return config | overrides


def random_hf_tensors(config: Mapping[str, Any], *, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights for `config` (norm scales near 1), Hugging Face names."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, expected in expected_hf_shapes(config).items():
        if name.endswith("norm.weight"):
            tensors[name] = (1.0 + 0.1 * rng.standard_normal(expected.shape)).astype(np.float32)
        else:
            tensors[name] = (0.05 * rng.standard_normal(expected.shape)).astype(np.float32)
    return tensors


def write_hf_directory(
    directory: Path,
    config: Mapping[str, Any],
    tensors: Mapping[str, np.ndarray],
    tokenizer: PreTrainedTokenizerFast | None,
    *,
    shards: int = 1,
    bfloat16: bool = False,
) -> Path:
    """Write a checkpoint directory: config.json, safetensors (sharded with an index when
    `shards > 1`), and the tokenizer's files (`save_pretrained`)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(dict(config), indent=2))
    stored = {
        name: (array.astype(ml_dtypes.bfloat16) if bfloat16 else array)
        for name, array in tensors.items()
    }
    names = sorted(stored)
    if shards == 1:
        safetensors.numpy.save_file(stored, str(directory / "model.safetensors"))
    else:
        weight_map: dict[str, str] = {}
        for index in range(shards):
            part = names[index::shards]
            filename = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
            safetensors.numpy.save_file({n: stored[n] for n in part}, str(directory / filename))
            weight_map |= dict.fromkeys(part, filename)
        index_json = {"metadata": {"total_size": 0}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index_json))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))
    return directory


def write_hf_cache_entry(cache_dir: Path, repo_id: str, source: Path) -> Path:
    """Lay a checkpoint directory out as `huggingface_hub`'s cache does (refs/main → snapshot)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache_dir / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    (repo / "blobs").mkdir()
    for file in sorted(source.iterdir()):
        (snapshot / file.name).write_bytes(file.read_bytes())
    return snapshot


def write_gguf(
    path: Path,
    config: Mapping[str, Any],
    tensors: Mapping[str, np.ndarray],
    tokenizer: PreTrainedTokenizerFast | None,
    *,
    quantize: Mapping[str, gguf.GGMLQuantizationType] | None = None,
    metadata_overrides: Mapping[str, Any] | None = None,
    extra_tensors: Mapping[str, tuple[np.ndarray, gguf.GGMLQuantizationType | None]] | None = None,
    drop_fields: tuple[str, ...] = (),
) -> Path:
    """Write a GGUF file as llama.cpp's converter would (Llama q/k rows permuted for RoPE).

    Args:
        path: the file.
        config: the Hugging Face config the metadata states.
        tensors: Hugging Face-named float32 weights (HF layout).
        tokenizer: written as `tokenizer.ggml.*` metadata (byte-level BPE, pre `gpt2`).
        quantize: llama.cpp tensor name → quantisation type (default F32).
        metadata_overrides: `{key: value}` for string/int/float metadata, replacing defaults.
        extra_tensors: raw tensors added as is (name → (array, raw dtype or None)).
        drop_fields: metadata keys not to write.
    """
    arch = str(config["model_type"])
    writer = gguf.GGUFWriter(str(path), arch)
    heads, kv_heads = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    fields: dict[str, Any] = {
        f"{arch}.block_count": int(config["num_hidden_layers"]),
        f"{arch}.context_length": int(config["max_position_embeddings"]),
        f"{arch}.embedding_length": int(config["hidden_size"]),
        f"{arch}.feed_forward_length": int(config["intermediate_size"]),
        f"{arch}.attention.head_count": heads,
        f"{arch}.attention.head_count_kv": kv_heads,
        f"{arch}.rope.freq_base": float(config["rope_theta"]),
        f"{arch}.attention.layer_norm_rms_epsilon": float(config["rms_norm_eps"]),
        f"{arch}.vocab_size": int(config["vocab_size"]),
        f"{arch}.rope.dimension_count": int(config["head_dim"]),
        f"{arch}.attention.key_length": int(config["head_dim"]),
    }
    fields |= dict(metadata_overrides or {})
    for key, value in fields.items():
        if key in drop_fields:
            continue
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    if tokenizer is not None:
        _add_tokenizer(writer, tokenizer)
    quantize = quantize or {}
    for name, array in tensors.items():
        if config.get("tie_word_embeddings") and name == "lm_head.weight":
            continue
        values = array
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            values = permute_rope_rows(values, heads)
        if arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            values = permute_rope_rows(values, kv_heads)
        gguf_name = hf_to_gguf_name(name)
        qtype = quantize.get(gguf_name)
        if qtype is None:
            writer.add_tensor(gguf_name, np.ascontiguousarray(values, dtype=np.float32))
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(gguf_name, values.astype(np.float16))
        else:
            writer.add_tensor(gguf_name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    for name, (array, raw) in (extra_tensors or {}).items():
        writer.add_tensor(name, array, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_tokenizer(writer: gguf.GGUFWriter, tokenizer: PreTrainedTokenizerFast) -> None:
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = tokenizer.get_vocab()
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]]
    special = {added["content"] for added in state["added_tokens"] if added["special"]}
    user = {added["content"] for added in state["added_tokens"] if not added["special"]}
    types = [
        gguf.TokenType.CONTROL
        if token in special
        else gguf.TokenType.USER_DEFINED
        if token in user
        else gguf.TokenType.NORMAL
        for token in tokens
    ]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab["<|im_start|>"])
    writer.add_eos_token_id(vocab["<|im_end|>"])
    writer.add_unk_token_id(vocab["<|endoftext|>"])
    writer.add_pad_token_id(vocab["<|im_end|>"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)


def random_llama_trainer(states: Path, model_dir: Path, *, rank: int = 4) -> LocalTrainingClient:
    """A LoRA training client of rank `rank` on a random tiny Llama written to `model_dir`
    (`train_tokenizer`'s vocabulary), checkpointing under `states`."""
    tokenizer = train_tokenizer()
    config = hf_config("llama", vocab_size=len(tokenizer))
    write_hf_directory(model_dir, config, random_hf_tensors(config, seed=1), tokenizer)
    service = LocalServiceClient(seed=0, checkpoint_dir=states)
    return service.create_lora_training_client(base_model=str(model_dir), rank=rank).result()


def restoring_routes(trainer: LocalTrainingClient) -> Iterator[LocalTrainingClient]:
    """A fixture body sharing a module's `trainer`: its prefix-route settings and gradient
    restored after each test (a test that sets `prefix_route` leaves the next the defaults)."""
    settings = (trainer.prefix_route, trainer.prefix_sharing_fraction, trainer._auto_route)
    yield trainer
    trainer.prefix_route, trainer.prefix_sharing_fraction, trainer._auto_route = settings
    trainer._grads = None
