"""A tiny random Llama checkpoint directory with the byte tokenizer, for tests run offline.

`write_tiny_llama(directory)` writes what a Hugging Face checkpoint directory holds and what
every reader of a model name that is a local directory accepts: `rlpure serve` (a LoRA on a
local pretrained model, `shell.local._models.resolve_base_model`), the cookbook's
`tokenizer_utils.get_tokenizer` (`os.path.isdir` → `AutoTokenizer.from_pretrained`) and the
SDK's `TrainingClient.get_tokenizer` (the `tokenizer_id` the server returns):

- the byte tokenizer (`rlpure.model.ByteTokenizer`) as its equivalent fast tokenizer
  (`shell.local._tokenizer_dirs.write_tokenizer_dir`: `tokenizer.json` and its config), so the
  vocabulary is 259 and the `role_colon` renderer works;
- `config.json` of a `LlamaForCausalLM` with `TINY_LLAMA_CONFIG`'s sizes;
- `model.safetensors`: every tensor the config implies (`shell.local._hf.expected_hf_shapes`,
  Hugging Face names and `[out, in]` layouts), float32, normal(0, 0.02) from a fixed seed
  (norm weights one), so two writes give the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from rlpure.model import VOCAB_SIZE, ByteTokenizer
from shell.local._hf import expected_hf_shapes
from shell.local._tokenizer_dirs import write_tokenizer_dir

__all__ = ["TINY_LLAMA_CONFIG", "random_weights", "write_tiny_llama"]

TINY_LLAMA_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
    "bos_token_id": 256,
    "eos_token_id": 257,
    "pad_token_id": 258,
    "torch_dtype": "float32",
}
"""One layer, width 32, two heads, 2,048 positions (the context of multi-turn envs)."""


def random_weights(config: dict[str, Any], *, seed: int) -> dict[str, np.ndarray]:
    """Every tensor `config` implies, float32, normal(0, 0.02) from `seed`, norm weights one."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, expected in sorted(expected_hf_shapes(config).items()):
        if name.endswith("norm.weight"):
            weights[name] = np.ones(expected.shape, np.float32)
        else:
            weights[name] = rng.normal(0.0, 0.02, expected.shape).astype(np.float32)
    return weights


def write_tiny_llama(directory: Path, *, seed: int = 0) -> Path:
    """Writes the tiny checkpoint directory (see the module docstring); returns its absolute path.

    Args:
        directory: where to write it (replaced if it exists: the tokenizer writer renames a
            whole folder into place, so the weights and config are written after it).
        seed: the weights' random seed.

    Returns:
        `directory` as an absolute path.
    """
    directory = write_tokenizer_dir(ByteTokenizer(), Path(directory))
    (directory / "config.json").write_text(json.dumps(TINY_LLAMA_CONFIG, indent=2) + "\n")
    save_file(
        random_weights(TINY_LLAMA_CONFIG, seed=seed),
        str(directory / "model.safetensors"),
        metadata={"format": "pt"},
    )
    return directory
