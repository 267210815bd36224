"""Our loading of GGUF checkpoints against `transformers`' own GGUF loading (torch).

- The packaged SmolLM2-135M-Instruct GGUF: token ids of our tokenizer (built with `tokenizers`
  from the file's metadata) identical to `AutoTokenizer.from_pretrained(dir, gguf_file=...)` on
  varied text and on the chat template; per-token logprobs of our JAX forward on our
  dequantised weights within 2e-3 of `AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`.
- Small GGUFs written here (Llama with its permuted q/k rows, quantised tensors; Qwen2):
  our dequantised, renamed and un-permuted tensors equal the state dict transformers builds.

Needs torch and accelerate (transformers refuses GGUF model loading without the latter), so
it runs under the cookbook venv (`.cbvenv`); skipped elsewhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate", reason="transformers loads GGUF models only with accelerate")

import gguf  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from shell.local._models import PACKAGED_MODELS, packaged_model_path, resolve_base_model  # noqa: E402
from tests.local.hf_fixtures import (  # noqa: E402
    hf_config,
    random_hf_tensors,
    train_tokenizer,
    write_gguf,
)

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
TEXTS = (
    "Hello world!",
    "What is 123 + 4567? Let's think step by step: 123 + 4567 = 4690.",
    "  two leading spaces, trailing  ",
    "tabs\tand\nnew\n\nlines\r\n",
    "Ünïcödé: café, naïve, 東京, Привет, emoji 🙂👍🏽",
    "code: def f(x):\n    return x**2  # square\n",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>special tokens inside<|im_end|>text",
    "'s 're 've 'll 'd don't I'm",
    "1,000,000.50 and 3.14159 and 2026-12-01",
    "",
)
CONVERSATIONS = (
    [{"role": "user", "content": "What is 2 + 2?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another?"},
    ],
)


@pytest.fixture(scope="module")
def smollm2_path() -> Path:
    return packaged_model_path(SMOLLM2, PACKAGED_MODELS[SMOLLM2])


@pytest.fixture(scope="module")
def reference_tokenizer(smollm2_path: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(smollm2_path.parent), gguf_file=smollm2_path.name)


@pytest.fixture(scope="module")
def smollm2() -> Any:
    return resolve_base_model(SMOLLM2)


def test_smollm2_token_ids(smollm2: Any, reference_tokenizer: Any) -> None:
    ours = smollm2.load_tokenizer()
    assert len(ours) == len(reference_tokenizer)
    for text in (*TEXTS, "".join(TEXTS)):
        for special in (False, True):
            want = reference_tokenizer.encode(text, add_special_tokens=special)
            assert ours.encode(text, add_special_tokens=special) == want, (text, special)
        ids = ours.encode(text, add_special_tokens=False)
        assert ours.decode(ids) == reference_tokenizer.decode(ids), text
        assert ours.decode(ids, skip_special_tokens=True) == reference_tokenizer.decode(
            ids, skip_special_tokens=True
        )
    for messages in CONVERSATIONS:
        for generation in (False, True):
            kwargs = {"add_generation_prompt": generation}
            assert ours.apply_chat_template(messages, tokenize=False, **kwargs) == (
                reference_tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
            )
            text = reference_tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
            assert ours.encode(text, add_special_tokens=False) == reference_tokenizer.encode(
                text, add_special_tokens=False
            )
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert getattr(ours, name) == getattr(reference_tokenizer, name), name
    assert sorted(ours.all_special_tokens) == sorted(reference_tokenizer.all_special_tokens)


def _transformers_state(directory: Path, filename: str) -> dict[str, np.ndarray]:
    model = AutoModelForCausalLM.from_pretrained(
        str(directory), gguf_file=filename, dtype=torch.float32
    )
    return {name: value.numpy() for name, value in model.state_dict().items()}


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_small_gguf_tensors_match_transformers(tmp_path: Path, model_type: str) -> None:
    tokenizer = train_tokenizer()
    config = hf_config(model_type, vocab_size=len(tokenizer))
    tensors = random_hf_tensors(config, seed=5)
    q = gguf.GGMLQuantizationType
    quantize = {
        "blk.0.attn_q.weight": q.Q4_1,
        "blk.1.attn_k.weight": q.Q8_0,
        "token_embd.weight": q.Q8_0,
    }
    path = write_gguf(tmp_path / "m.gguf", config, tensors, tokenizer, quantize=quantize)
    ours = resolve_base_model(str(path)).load_tensors()
    reference = _transformers_state(tmp_path, path.name)
    tied = config["tie_word_embeddings"]
    assert sorted(ours) == sorted(n for n in reference if not (tied and n == "lm_head.weight"))
    for name, array in ours.items():
        np.testing.assert_array_equal(array, reference[name], err_msg=name)


def test_smollm2_logprobs(smollm2: Any, smollm2_path: Path, reference_tokenizer: Any) -> None:
    import jax.numpy as jnp

    from rlpure import model as model_lib

    config = smollm2.model_config(max_seq_len=256)
    params = smollm2.load_params(config)
    texts = [
        reference_tokenizer.apply_chat_template(
            CONVERSATIONS[1], tokenize=False, add_generation_prompt=True
        )
        + "Sure: 11 is prime.",
        "The capital of France is Paris. The capital of Italy is Rome.",
    ]
    rows = [reference_tokenizer.encode(text, add_special_tokens=False) for text in texts]
    length = max(len(row) for row in rows)
    tokens = np.zeros((len(rows), length), np.int32)
    for b, row in enumerate(rows):
        tokens[b, : len(row)] = row
    ours = np.asarray(
        model_lib.target_logprobs(
            params, jnp.asarray(tokens[:, :-1]), jnp.asarray(tokens[:, 1:]), config=config
        )
    )
    model = AutoModelForCausalLM.from_pretrained(
        str(smollm2_path.parent), gguf_file=smollm2_path.name, dtype=torch.float32
    )
    model.eval()
    for b, row in enumerate(rows):
        ids = torch.tensor([row])
        with torch.no_grad():
            logits = model(ids).logits[0, :-1].double()
        want = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0].numpy()
        got = ours[b, : len(row) - 1]
        gap = float(np.abs(got - want).max())
        print(f"row {b}: {len(row) - 1} tokens, max |logprob gap| {gap:.2e}")
        assert gap < 2e-3, gap
