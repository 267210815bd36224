"""A tiny random Llama checkpoint whose tokenizer has Qwen's chat and tool tokens, offline.

The byte tokenizer of `tiny_hf_model.py` serves the `role_colon` renderer, which has no tool
calling (the cookbook's raises `NotImplementedError` too). Recipes whose envs call tools
(`rl_numerics_check`'s `read_page`) need a renderer such as `qwen3`, and that needs
`<|im_start|>` / `<|im_end|>` to be single special tokens. `write_tiny_chat_llama(directory,
texts)` writes a Hugging Face checkpoint directory with:

- a byte-level BPE trained on `texts` (every byte in its alphabet, so any text encodes), with
  Qwen's special tokens (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, the end of a turn
  being the EOS) and its added tokens (`<think>`, `<tool_call>`, `<tool_response>` and their
  closing forms), as `test_message_env_parity.py` builds one;
- `config.json` of a `LlamaForCausalLM` with `TINY_LLAMA_CONFIG`'s sizes and the tokenizer's
  vocabulary; `model.safetensors` from a fixed seed, as `tiny_hf_model.py` writes it.

`rlpure serve` takes the directory as a `base_model` and hands its tokenizer out through
`get_info`; the cookbook's renderers (`qwen3`) accept it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from safetensors.numpy import save_file

from shell.local._tokenizer_dirs import write_tokenizer_dir
from tests.parity.tiny_hf_model import TINY_LLAMA_CONFIG, random_weights

__all__ = ["write_tiny_chat_llama"]

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ADDED_TOKENS: tuple[str, ...] = ("<think>", "</think>", "<tool_call>", "</tool_call>")
ADDED_TOKENS += ("<tool_response>", "</tool_response>")


def write_tiny_chat_llama(
    directory: Path, texts: Iterable[str], *, vocab_size: int = 1024, seed: int = 0
) -> Path:
    """Writes the checkpoint directory (see the module docstring); returns its absolute path.

    Args:
        directory: where to write it (replaced if it exists).
        texts: what the BPE's merges are learned from (the recipe's prompts and data).
        vocab_size: the BPE's vocabulary before the added tokens.
        seed: the weights' random seed.

    Returns:
        `directory` as an absolute path.
    """
    import tokenizers
    import transformers

    model = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    model.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    model.train_from_iterator(texts, trainer=trainer)
    model.add_tokens(
        [tokenizers.AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS]
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=model, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    directory = write_tokenizer_dir(fast, Path(directory))
    config = {
        **TINY_LLAMA_CONFIG,
        "vocab_size": len(fast),
        "bos_token_id": None,
        "eos_token_id": fast.eos_token_id,
        "pad_token_id": fast.pad_token_id,
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(
        random_weights(config, seed=seed),
        str(directory / "model.safetensors"),
        metadata={"format": "pt"},
    )
    return directory
