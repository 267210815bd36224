"""`ByteTokenizer` against a real Hugging Face tokenizer with the same vocabulary.

The reference is a `transformers.PreTrainedTokenizerFast` built in memory (no hub): a byte-level
BPE with no merges whose ids are the byte values, `<|bos|>`/`<|eos|>`/`<|pad|>` as its special
tokens 256/257/258 and a template that prepends BOS. Whatever `encode` and `decode` the
cookbook's renderers call (`encode(text, add_special_tokens=False)` on a special token's text,
`decode(ids)`, `decode(ids, skip_special_tokens=True)`) must give what that HF tokenizer gives.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpure.model import ByteTokenizer

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

TOK = ByteTokenizer()


def _gpt2_byte_chars() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte (what `ByteLevel` pre-tokenizes to)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def _reference() -> Any:
    models, pre_tokenizers = tokenizers.models, tokenizers.pre_tokenizers
    vocab = {char: byte for byte, char in _gpt2_byte_chars().items()}
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = tokenizers.decoders.ByteLevel()
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>"
    )
    hf._tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
        single="<|bos|> $A", special_tokens=[("<|bos|>", 256)]
    )
    return hf


HF = _reference()

SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|", "|>", "<|eos", "bos|>"]
texts = st.lists(
    st.one_of(
        st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=20),
        st.sampled_from(SPECIALS),
    ),
    max_size=8,
).map("".join)


def test_the_reference_has_the_same_special_ids() -> None:
    assert HF.convert_tokens_to_ids(["<|bos|>", "<|eos|>", "<|pad|>"]) == [256, 257, 258]
    assert (HF.bos_token, HF.eos_token, HF.pad_token) == (
        TOK.bos_token,
        TOK.eos_token,
        TOK.pad_token,
    )
    assert (HF.bos_token_id, HF.eos_token_id, HF.pad_token_id) == (
        TOK.bos_token_id,
        TOK.eos_token_id,
        TOK.pad_token_id,
    )


def test_a_renderers_bos_text_encodes_as_the_bos_id() -> None:
    """The cookbook's `_bos_tokens`: `encode(tokenizer.bos_token, add_special_tokens=False)`."""
    assert TOK.encode(TOK.bos_token, add_special_tokens=False) == [TOK.bos_token_id]
    assert TOK.encode(TOK.bos_token, add_special_tokens=False) == HF.encode(
        HF.bos_token, add_special_tokens=False
    )


@settings(max_examples=300, deadline=None)
@given(texts, st.booleans())
def test_encode_matches_hugging_face(text: str, add_special_tokens: bool) -> None:
    assert TOK.encode(text, add_special_tokens=add_special_tokens) == HF.encode(
        text, add_special_tokens=add_special_tokens
    )


@settings(max_examples=200, deadline=None)
@given(texts)
def test_split_special_tokens_matches_hugging_face(text: str) -> None:
    assert TOK.encode(text, add_special_tokens=False, split_special_tokens=True) == HF.encode(
        text, add_special_tokens=False, split_special_tokens=True
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 258), max_size=40), st.booleans())
def test_decode_matches_hugging_face(ids: list[int], skip_special_tokens: bool) -> None:
    assert TOK.decode(ids, skip_special_tokens=skip_special_tokens) == HF.decode(
        ids, skip_special_tokens=skip_special_tokens
    )
