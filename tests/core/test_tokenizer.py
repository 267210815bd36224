"""Tests for `rlpure.model.ByteTokenizer`: exact round trips, special tokens, bad input."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpure.model import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, ByteTokenizer

TOK = ByteTokenizer()
# Any Unicode text UTF-8 can encode (lone surrogates cannot be, and are refused).
texts = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=200)
SPECIAL_TEXTS = ("<|bos|>", "<|eos|>", "<|pad|>")
# Texts with special-token texts (and near misses) spliced in, which plain `st.text` never hits.
texts_with_specials = st.lists(
    st.one_of(texts, st.sampled_from([*SPECIAL_TEXTS, "<|", "|>", "<|eos", "<|bos|"])),
    max_size=8,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(texts_with_specials)
def test_round_trip_without_special_tokens(text: str) -> None:
    ids = TOK.encode(text, add_special_tokens=False)
    assert TOK.decode(ids) == text
    assert ids.count(EOS_ID) == text.count("<|eos|>")
    plain = TOK.encode(text, add_special_tokens=False, split_special_tokens=True)
    assert plain == list(text.encode("utf-8"))
    assert TOK.decode(plain) == text


@settings(max_examples=200, deadline=None)
@given(texts_with_specials)
def test_special_texts_map_to_their_ids_and_the_rest_to_bytes(text: str) -> None:
    """Reference: split on the special texts by hand, bytes in between (HF's default)."""
    expected: list[int] = []
    rest = text
    while rest:
        hits = [(rest.find(s), s) for s in SPECIAL_TEXTS if s in rest]
        if not hits:
            expected.extend(rest.encode("utf-8"))
            break
        at, special = min(hits)
        expected.extend(rest[:at].encode("utf-8"))
        expected.append(TOK.convert_tokens_to_ids(special))  # type: ignore[arg-type]
        rest = rest[at + len(special) :]
    assert TOK.encode(text, add_special_tokens=False) == expected
    assert TOK.encode(text) == [BOS_ID, *expected]


@settings(max_examples=200, deadline=None)
@given(texts)
def test_round_trip_with_bos(text: str) -> None:
    ids = TOK.encode(text)
    assert ids[0] == BOS_ID
    assert TOK.decode(ids, skip_special_tokens=True) == text
    assert TOK.decode(ids) == "<|bos|>" + text


def _skipping_decode(ids: list[int]) -> str:
    """Slow reference of `skip_special_tokens=True`: drop the specials, then decode the bytes
    left as one run (Hugging Face's order: the bytes on both sides of a special join up)."""
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def _split_runs_decode(ids: list[int]) -> str:
    """Slow reference with specials kept: each maximal byte run decoded apart, specials as text."""
    out, run = [], bytearray()
    for i in ids:
        if i < 256:
            run.append(i)
        else:
            out.append(run.decode("utf-8", errors="replace"))
            out.append(TOK.decode([i]))
            run = bytearray()
    out.append(run.decode("utf-8", errors="replace"))
    return "".join(out)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, VOCAB_SIZE - 1), max_size=64))
def test_decode_any_ids_matches_run_by_run_reference(ids: list[int]) -> None:
    assert TOK.decode(ids, skip_special_tokens=True) == _skipping_decode(ids)
    with_specials = TOK.decode(ids)
    assert with_specials == _split_runs_decode(ids)
    assert with_specials.count("<|eos|>") >= ids.count(EOS_ID)


def test_golden_values() -> None:
    assert TOK.encode("hi") == [BOS_ID, 104, 105]
    assert TOK.encode("é", add_special_tokens=False) == [0xC3, 0xA9]
    assert TOK.decode([BOS_ID, 104, EOS_ID, PAD_ID]) == "<|bos|>h<|eos|><|pad|>"
    assert TOK.decode([0xFF, 104]) == "\ufffdh"  # invalid UTF-8 → replacement char
    assert TOK.decode([0xC3, EOS_ID, 0xA9], skip_special_tokens=True) == "é"  # as HF: joined
    assert TOK.decode([0xC3, EOS_ID, 0xA9]) == "\ufffd<|eos|>\ufffd"
    assert TOK.decode(np.array([104, 105], np.int32)) == "hi"
    assert TOK.decode(104) == "h"
    assert TOK.decode([]) == ""
    assert TOK.encode("<|eos|>", add_special_tokens=False) == [EOS_ID]
    assert TOK.encode(TOK.bos_token, add_special_tokens=False) == [BOS_ID]
    assert TOK.encode("a<|pad|>", add_special_tokens=False, split_special_tokens=True) == [
        97,
        *b"<|pad|>",
    ]
    assert TOK.convert_tokens_to_ids(["<|eos|>", "<0x68>"]) == [EOS_ID, 104]
    assert TOK.convert_tokens_to_ids(TOK.convert_ids_to_tokens(list(range(VOCAB_SIZE)))) == list(
        range(VOCAB_SIZE)
    )
    assert TOK.batch_decode([[104], [105, EOS_ID]], skip_special_tokens=True) == ["h", "i"]
    assert TOK.convert_ids_to_tokens([104, EOS_ID]) == ["<0x68>", "<|eos|>"]


def test_hf_like_attributes() -> None:
    assert (TOK.bos_token_id, TOK.eos_token_id, TOK.pad_token_id) == (256, 257, 258)
    assert TOK.vocab_size == len(TOK) == VOCAB_SIZE == 259
    assert TOK.name_or_path == "rlpure/byte"
    assert TOK.eos_token == "<|eos|>" and TOK.bos_token == "<|bos|>"
    assert ByteTokenizer() == TOK and hash(ByteTokenizer()) == hash(TOK)


def test_bad_input_is_refused_with_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"id 300 at position 1"):
        TOK.decode([104, 300])
    with pytest.raises(ValueError, match=r"id -1 at position 0"):
        TOK.decode([-1])
    with pytest.raises(TypeError, match="expected str"):
        TOK.encode(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not valid Unicode"):
        TOK.encode("\ud800")
    with pytest.raises(TypeError, match="integers"):
        TOK.decode([1.5, 2.0])
    with pytest.raises(ValueError, match="1-D"):
        TOK.decode([[1, 2]])
    with pytest.raises(ValueError, match=re.escape("'<|unk|>' is not a token")):
        TOK.convert_tokens_to_ids("<|unk|>")
