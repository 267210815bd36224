"""A tiny lossless tokenizer with special tokens, for doctests and tests of the chat renderers.

`SpecialWordTokenizer(specials)`: each special-token string is one id (`0..len(specials)-1`,
in the given order), found greedily, longest first, wherever it occurs in the text; every other
character is its UTF-8 bytes at ids `len(specials) + byte`. `decode` inverts `encode` exactly.
It stands in for a Hugging Face tokenizer in `tests/core` (no files, no `tokenizers`).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["CHAT_SPECIAL_TOKENS", "SpecialWordTokenizer"]

CHAT_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)
"""The control tokens of the ChatML, Qwen3 and Llama 3 formats."""


class SpecialWordTokenizer:
    """Special tokens as single ids, other text as UTF-8 bytes (see the module docstring).

    Args:
        specials: the special-token strings; `bos_token`/`eos_token` name two of them.
        bos_token: the BOS string (its id is `bos_token_id`), or None.
        eos_token: the EOS string, or None.
    """

    def __init__(
        self,
        specials: Sequence[str] = CHAT_SPECIAL_TOKENS,
        *,
        bos_token: str | None = None,
        eos_token: str | None = "<|endoftext|>",
    ) -> None:
        self.specials = tuple(specials)
        self._ids = {text: i for i, text in enumerate(self.specials)}
        self._by_length = sorted(self.specials, key=len, reverse=True)
        self.bos_token_id = None if bos_token is None else self._ids[bos_token]
        self.eos_token_id = None if eos_token is None else self._ids[eos_token]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text` (`add_special_tokens` prepends the BOS id when there is one)."""
        offset = len(self.specials)
        ids = [self.bos_token_id] if add_special_tokens and self.bos_token_id is not None else []
        i = 0
        while i < len(text):
            for special in self._by_length:
                if text.startswith(special, i):
                    ids.append(self._ids[special])
                    i += len(special)
                    break
            else:
                ids += [offset + b for b in text[i].encode("utf-8")]
                i += 1
        return ids

    def encode_literally(self, text: str) -> list[int]:
        """Token ids of `text` with special-token strings spelled as bytes."""
        offset = len(self.specials)
        return [offset + b for b in text.encode("utf-8")]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids` (special tokens included)."""
        offset = len(self.specials)
        out = bytearray()
        for token in ids:
            token = int(token)
            if token < offset:
                out += self.specials[token].encode("utf-8")
            else:
                out.append(token - offset)
        return out.decode("utf-8", errors="replace")
