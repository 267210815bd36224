"""A byte-level tokenizer with a Hugging Face-like surface, for the local JAX backend.

Conventions:
- Ids `0..255` are the UTF-8 bytes of the text, so every string encodes and decodes exactly:
  `decode(encode(s, add_special_tokens=False)) == s` for any `str` (surrogates excepted, which
  UTF-8 cannot represent; they are refused with a `ValueError`).
- Three special tokens follow the bytes: `BOS_ID = 256` (`"<|bos|>"`), `EOS_ID = 257`
  (`"<|eos|>"`) and `PAD_ID = 258` (`"<|pad|>"`); `vocab_size == 259`.
- Special tokens are only produced by `add_special_tokens=True` (a leading BOS) or by passing
  their ids explicitly. The *text* `"<|eos|>"` encodes as its seven bytes, never as `EOS_ID`,
  so user content cannot inject control tokens.
- Decoding joins runs of byte ids and decodes them as UTF-8 with the replacement character
  for invalid sequences (a model can emit any byte string; decoding never raises on it).

The class is immutable and holds no state, so one instance can be shared freely.
"""

from __future__ import annotations

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

    def __len__(self) -> int:
        return VOCAB_SIZE

    def __repr__(self) -> str:
        return "ByteTokenizer()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByteTokenizer)

    def __hash__(self) -> int:
        return hash(ByteTokenizer)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Encodes `text` as its UTF-8 bytes, with a leading BOS when `add_special_tokens`.

        Raises:
            TypeError: if `text` is not a `str`.
            ValueError: if `text` holds a lone surrogate (not encodable as UTF-8).
        """
        if not isinstance(text, str):
            raise TypeError(f"ByteTokenizer.encode: expected str, got {type(text).__name__}")
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(f"ByteTokenizer.encode: text is not valid Unicode: {err}") from None
        ids = list(data)
        return [BOS_ID, *ids] if add_special_tokens else ids

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
            if run:
                out.append(run.decode("utf-8", errors="replace"))
                run.clear()
            if not skip_special_tokens:
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
