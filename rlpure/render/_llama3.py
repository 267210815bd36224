"""The Llama 3 Instruct chat format as pure functions (cookbook `llama3`).

Conventions (tinker-cookbook 0.6.1's `Llama3Renderer`):
- `<|begin_of_text|>` (encoded from its text), then per message the header
  `<|start_header_id|>{role}<|end_header_id|>\\n\\n` and the output `{content}<|eot_id|>`,
  encoded as one string (so content that spells `<|eot_id|>` ends the turn, as in the
  cookbook). The generation prompt ends with the header of the turn to write; the stop
  sequence is the `<|eot_id|>` token id. No "Cutting Knowledge Date" system preamble (the
  cookbook leaves Hugging Face's out too).
- Every turn renders the same in every prefix: the prefix property holds.
- Content is text: a string or text parts (joined). Thinking parts and `tool_calls` are refused
  with an error naming the message — Llama 3's tool calls are bare JSON, indistinguishable
  from a JSON answer, so the cookbook has no tool-call syntax for it (and silently drops
  `tool_calls`; we refuse rather than train on a turn that lost its calls). Tool *results*
  (`role="tool"`, or Llama 3.1's `"ipython"`) render as their role.
- Parsing: the text before `<|eot_id|>` is the content (`"stop_sequence"`); without it the
  response is `"malformed"`; several are a `ValueError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlpure.render._chat import ChatTemplateRenderer, RenderContext, RenderedMessage
from rlpure.render._types import ParsedResponse, TokenizerLike, check_chat_messages

__all__ = ["Llama3Renderer"]

_ROLES = ("system", "user", "assistant", "tool", "ipython")


def _text(content: str | Sequence[Mapping[str, Any]]) -> str:
    return content if isinstance(content, str) else "".join(p["text"] for p in content)


class Llama3Renderer(ChatTemplateRenderer):
    """Llama 3 Instruct turns; layout in the module docstring.

    Examples:
        >>> from rlpure.render._testing import SpecialWordTokenizer
        >>> tok = SpecialWordTokenizer()
        >>> r = Llama3Renderer(tok)
        >>> tok.decode(r.build_generation_prompt([{"role": "user", "content": "hi"}]).to_ints())
        '<|begin_of_text|><|start_header_id|>user<|end_header_id|>\\n\\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\\n\\n'
        >>> r.parse_response(tok.encode("hello<|eot_id|>")).content
        'hello'
    """

    name = "llama3"

    def __init__(self, tokenizer: TokenizerLike) -> None:
        super().__init__(tokenizer)
        self._eot = self._single_token("<|eot_id|>")

    def get_stop_sequences(self) -> tuple[int, ...]:
        """The `<|eot_id|>` token id."""
        return (self._eot,)

    def _check(self, messages: Sequence[Mapping[str, Any]]) -> None:
        check_chat_messages(messages, roles=_ROLES, thinking=False, tool_calls=False)

    def _bos(self) -> list[int]:
        return self._encode("<|begin_of_text|>")

    def _render(self, message: Mapping[str, Any], ctx: RenderContext) -> RenderedMessage:
        header = f"<|start_header_id|>{message['role']}<|end_header_id|>\n\n"
        return RenderedMessage(
            self._encode(header), self._encode(_text(message["content"]) + "<|eot_id|>")
        )

    def parse_response(self, tokens: Sequence[int] | np.ndarray) -> ParsedResponse:
        """Sampled tokens (through `<|eot_id|>`) read back as the assistant's text.

        Raises:
            ValueError: for more than one `<|eot_id|>`.
        """
        text, stopped = self._split_on_stop_token(tokens, self._eot)
        return ParsedResponse(content=text, termination="stop_sequence" if stopped else "malformed")
