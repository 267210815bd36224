"""A byte-level tokenizer with a Hugging Face-like surface, for the local JAX backend.

Conventions:
- Ids `0..255` are the UTF-8 bytes of the text, so every string encodes and decodes exactly:
  `decode(encode(s, add_special_tokens=False)) == s` for any `str` (surrogates excepted, which
  UTF-8 cannot represent; they are refused with a `ValueError`).
- Three special tokens follow the bytes: `BOS_ID = 256` (`"<|bos|>"`), `EOS_ID = 257`
  (`"<|eos|>"`) and `PAD_ID = 258` (`"<|pad|>"`); `vocab_size == 259`.
- Special tokens, as a Hugging Face tokenizer's: `add_special_tokens=True` adds a leading BOS,
  and the *text* of a special token (`"<|bos|>"`, `"<|eos|>"`, `"<|pad|>"`) encodes as its id
  wherever it occurs (HF's default, `split_special_tokens=False`), so a renderer that writes
  `tokenizer.encode(tokenizer.bos_token, add_special_tokens=False)` gets `[BOS_ID]`.
  `split_special_tokens=True` (HF's option of that name) encodes such text as its plain bytes
  instead, so untrusted content cannot inject control tokens.
- `decode(encode(s, add_special_tokens=False)) == s` holds either way (special ids decode to
  their text unless `skip_special_tokens`); `encode(s, add_special_tokens=False,
  split_special_tokens=True) == list(s.encode("utf-8"))`.
- Decoding joins runs of byte ids and decodes them as UTF-8 with the replacement character
  for invalid sequences (a model can emit any byte string; decoding never raises on it).

The class is immutable and holds no state, so one instance can be shared freely.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, Final

import numpy as np

__all__ = ["BOS_ID", "EOS_ID", "NUM_BYTES", "PAD_ID", "VOCAB_SIZE", "ByteTokenizer"]

NUM_BYTES: Final = 256
"""Ids 0..255 are the bytes themselves."""
BOS_ID: Final = 256
"""Beginning of sequence (`<|bos|>`)."""
EOS_ID: Final = 257
"""End of sequence (`<|eos|>`); sampling stops on it by default."""
PAD_ID: Final = 258
"""Padding (`<|pad|>`); never a training target."""
VOCAB_SIZE: Final = 259
"""Bytes plus the three special ids."""

_SPECIAL_TEXT: Final = {BOS_ID: "<|bos|>", EOS_ID: "<|eos|>", PAD_ID: "<|pad|>"}
_SPECIAL_ID: Final = {text: token for token, text in _SPECIAL_TEXT.items()}
_SPECIAL_SPLIT: Final = re.compile("(" + "|".join(map(re.escape, _SPECIAL_ID)) + ")")
"""Splits text around special-token texts (kept, as odd items of `re.split`)."""


def _as_id_list(ids: Any) -> list[int]:
    """Reads token ids from an int, a sequence, or a numpy/JAX array into a list of ints."""
    if isinstance(ids, (bool, np.bool_)):
        raise TypeError("ByteTokenizer.decode: ids must be integers, got bool")
    if isinstance(ids, (int, np.integer)):
        return [int(ids)]
    arr = np.asarray(ids)
    if arr.size == 0:
        return []
    if arr.ndim != 1:
        raise ValueError(f"ByteTokenizer.decode: expected a 1-D sequence of ids, got {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"ByteTokenizer.decode: ids must be integers, got dtype {arr.dtype}")
    ids_list: list[int] = arr.tolist()  # an integer array's `tolist` gives Python ints
    return ids_list


class ByteTokenizer:
    """UTF-8 byte tokenizer with BOS/EOS/PAD, usable where code expects a HF tokenizer.

    Examples:
        >>> tok = ByteTokenizer()
        >>> tok.encode("hi")
        [256, 104, 105]
        >>> tok.decode(tok.encode("hi"))
        '<|bos|>hi'
        >>> tok.decode(tok.encode("hi"), skip_special_tokens=True)
        'hi'
    """

    __slots__ = ()

    name_or_path: Final = "rlpure/byte"
    bos_token_id: Final = BOS_ID
    eos_token_id: Final = EOS_ID
    pad_token_id: Final = PAD_ID
    bos_token: Final = _SPECIAL_TEXT[BOS_ID]
    eos_token: Final = _SPECIAL_TEXT[EOS_ID]
    pad_token: Final = _SPECIAL_TEXT[PAD_ID]
    vocab_size: Final = VOCAB_SIZE
    all_special_ids: Final = (BOS_ID, EOS_ID, PAD_ID)
    all_special_tokens: Final = tuple(_SPECIAL_TEXT[token] for token in (BOS_ID, EOS_ID, PAD_ID))

    def __len__(self) -> int:
        return VOCAB_SIZE

    def __repr__(self) -> str:
        return "ByteTokenizer()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByteTokenizer)

    def __hash__(self) -> int:
        return hash(ByteTokenizer)

    def encode(
        self, text: str, add_special_tokens: bool = True, *, split_special_tokens: bool = False
    ) -> list[int]:
        """Encodes `text` as UTF-8 bytes, special-token texts as their ids (HF's default).

        Args:
            text: the text.
            add_special_tokens: prepend `BOS_ID` (HF: the tokenizer's template tokens).
            split_special_tokens: encode the text of a special token (`"<|eos|>"`) as its plain
                bytes instead of its id (HF's option of that name), for untrusted content.

        Raises:
            TypeError: if `text` is not a `str`.
            ValueError: if `text` holds a lone surrogate (not encodable as UTF-8).

        Examples:
            >>> ByteTokenizer().encode("a<|eos|>", add_special_tokens=False)
            [97, 257]
            >>> ByteTokenizer().encode("<|eos|>", add_special_tokens=False,
            ...                        split_special_tokens=True)[:3]
            [60, 124, 101]
        """
        if not isinstance(text, str):
            raise TypeError(f"ByteTokenizer.encode: expected str, got {type(text).__name__}")
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(f"ByteTokenizer.encode: text is not valid Unicode: {err}") from None
        ids = [BOS_ID] if add_special_tokens else []
        if split_special_tokens or "<|" not in text:
            ids.extend(data)
            return ids
        for index, piece in enumerate(_SPECIAL_SPLIT.split(text)):
            if index % 2:  # a special token's text (the split's captured group)
                ids.append(_SPECIAL_ID[piece])
            else:
                ids.extend(piece.encode("utf-8"))
        return ids

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        """Decodes token ids to text.

        Args:
            ids: an int, a sequence of ints, or a 1-D integer numpy/JAX array.
            skip_special_tokens: drop BOS/EOS/PAD instead of writing `"<|bos|>"` etc.

        Returns:
            The text; invalid UTF-8 byte runs become U+FFFD.

        Raises:
            ValueError: naming the position of an id outside `[0, vocab_size)`.
        """
        out: list[str] = []
        run = bytearray()
        for position, token in enumerate(_as_id_list(ids)):
            if 0 <= token < NUM_BYTES:
                run.append(token)
                continue
            special = _SPECIAL_TEXT.get(token)
            if special is None:
                raise ValueError(
                    f"ByteTokenizer.decode: id {token} at position {position} is outside "
                    f"[0, {VOCAB_SIZE})"
                )
            if skip_special_tokens:
                continue  # dropped first, as Hugging Face does: the bytes around it join up
            if run:
                out.append(run.decode("utf-8", errors="replace"))
                run.clear()
            out.append(special)
        if run:
            out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)

    def batch_decode(
        self, sequences: Iterable[Sequence[int] | np.ndarray], skip_special_tokens: bool = False
    ) -> list[str]:
        """Decodes each sequence of `sequences` (HF's `batch_decode`)."""
        return [self.decode(ids, skip_special_tokens=skip_special_tokens) for ids in sequences]

    def convert_ids_to_tokens(self, ids: Any) -> list[str]:
        """One string per id: the special token's text, or the byte as `"<0xNN>"`."""
        out = []
        for position, token in enumerate(_as_id_list(ids)):
            if not 0 <= token < VOCAB_SIZE:
                raise ValueError(
                    f"ByteTokenizer.convert_ids_to_tokens: id {token} at position {position} "
                    f"is outside [0, {VOCAB_SIZE})"
                )
            out.append(_SPECIAL_TEXT.get(token, f"<0x{token:02X}>"))
        return out

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int]:
        """The inverse of `convert_ids_to_tokens`: an id per token string (one id for a `str`).

        Raises:
            ValueError: naming a string that is neither a special token nor `"<0xNN>"`.
        """
        if isinstance(tokens, str):
            return self._token_to_id(tokens)
        return [self._token_to_id(token) for token in tokens]

    @staticmethod
    def _token_to_id(token: str) -> int:
        special = _SPECIAL_ID.get(token)
        if special is not None:
            return special
        match = re.fullmatch(r"<0x([0-9A-F]{2})>", token)
        if match is None:
            raise ValueError(
                f"ByteTokenizer.convert_tokens_to_ids: {token!r} is not a token of this "
                f"tokenizer (a special token or a byte '<0xNN>')"
            )
        return int(match[1], 16)
