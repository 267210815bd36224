"""A generic ChatML renderer (`<|im_start|>role\\n...<|im_end|>`) as pure functions.

Conventions (the format of SmolLM2-Instruct's chat template, and of Hermes-style tool use):
- Per message: header `"\\n<|im_start|>{role}\\n"` (no leading newline on the first message),
  output `{content}` (via `encode_content`) and the `<|im_end|>` token. The newline that the
  template writes after each `<|im_end|>` opens the next header instead, so the model's turn
  ends at `<|im_end|>`, the stop sequence (its token id), and each prompt extends the previous
  prompt plus the sampled turn: the prefix property holds. No BOS.
- Against the template's string: a generation prompt is the template's text with
  `add_generation_prompt=True` exactly; a full conversation is the template's text without its
  final `"\\n"` (which belongs to a turn nobody has written yet).
- `default_system_prompt`: when set and the first message is not a system message, a system
  message with that text comes first (SmolLM2's template does this with
  `SMOLLM2_DEFAULT_SYSTEM_PROMPT`). It is framing: weight 0 except under `"all_tokens"`, and
  only for a non-empty conversation (as the template: an empty one renders no system message).
- Content: text parts as written, thinking parts as `<think>{t}</think>`, nothing stripped
  from history. Roles are written as given (`tool` results as role `tool`).
- Tool calls follow the text: `"\\n"` (only when there is text), then the `<tool_call>`
  blocks joined by `"\\n"`; declarations with `tools_system_prompt` (Hermes/Qwen wording).
- Parsing: text before `<|im_end|>`, split into thinking, text and tool calls; the `"\\n"`
  put before each `<tool_call>` is framing and removed, so `parse_response` inverts rendering
  of an assistant message (adjacent text parts come back merged). Unlike the cookbook's qwen3,
  whose parsed text keeps that newline and grows one per render-parse round.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlpure.render._chat import ChatTemplateRenderer, RenderContext, RenderedMessage
from rlpure.render._qwen3 import _parse_blocks
from rlpure.render._tools import format_tool_calls, tools_system_prompt
from rlpure.render._types import ParsedResponse, TokenizerLike, check_chat_messages

__all__ = ["SMOLLM2_DEFAULT_SYSTEM_PROMPT", "ChatMLRenderer"]

SMOLLM2_DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
)
"""The system message SmolLM2-Instruct's template adds when a conversation has none."""

_ROLES = ("system", "user", "assistant", "tool")
_NEWLINE_BEFORE_CALL = re.compile(r"\n(?=<tool_call>)")


class ChatMLRenderer(ChatTemplateRenderer):
    """ChatML turns; layout in the module docstring.

    Args:
        tokenizer: a tokenizer with `<|im_start|>` and `<|im_end|>` as single tokens.
        default_system_prompt: system text put first when the conversation has none.
        encode_content: how message content is encoded (see `rlpure.render._chat`).

    Examples:
        >>> from rlpure.render._testing import SpecialWordTokenizer
        >>> tok = SpecialWordTokenizer()
        >>> r = ChatMLRenderer(tok)
        >>> tok.decode(r.build_generation_prompt([{"role": "user", "content": "hi"}]).to_ints())
        '<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n'
        >>> r.parse_response(tok.encode("hello<|im_end|>")).content
        'hello'
    """

    name = "chatml"

    def __init__(
        self,
        tokenizer: TokenizerLike,
        *,
        default_system_prompt: str | None = None,
        encode_content: Callable[[str], Sequence[int]] | None = None,
    ) -> None:
        super().__init__(tokenizer, encode_content=encode_content)
        self.default_system_prompt = default_system_prompt
        self._im_end = self._single_token("<|im_end|>")

    def get_stop_sequences(self) -> tuple[int, ...]:
        """The `<|im_end|>` token id."""
        return (self._im_end,)

    def tools_system_prompt(
        self, tools: Sequence[Mapping[str, Any]], system_prompt: str = ""
    ) -> str:
        """The system content declaring `tools` (`rlpure.render._tools.tools_system_prompt`)."""
        return tools_system_prompt(tools, system_prompt)

    def _check(self, messages: Sequence[Mapping[str, Any]]) -> None:
        check_chat_messages(messages, roles=_ROLES, thinking=True, tool_calls=True)

    def _messages(self, messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        if self.default_system_prompt is None or not messages or messages[0]["role"] == "system":
            return list(messages)
        return [{"role": "system", "content": self.default_system_prompt}, *messages]

    def _render(self, message: Mapping[str, Any], ctx: RenderContext) -> RenderedMessage:
        newline = "\n" if ctx.idx > 0 else ""
        header = f"{newline}<|im_start|>{message['role']}\n"
        content = message["content"]
        if isinstance(content, str):
            text = content
        else:
            text = "".join(
                p["text"] if p["type"] == "text" else f"<think>{p['thinking']}</think>"
                for p in content
            )
        if message.get("tool_calls"):
            text += ("\n" if text else "") + format_tool_calls(message["tool_calls"])
        return RenderedMessage(self._encode(header), [*self._encode_text(text), self._im_end])

    def parse_response(self, tokens: Sequence[int] | np.ndarray) -> ParsedResponse:
        """Sampled tokens (through `<|im_end|>`) read back as thinking, text and tool calls.

        Raises:
            ValueError: for more than one `<|im_end|>`.
        """
        text, stopped = self._split_on_stop_token(tokens, self._im_end)
        if not stopped:
            return ParsedResponse(content=text, termination="malformed")
        return _parse_blocks(_NEWLINE_BEFORE_CALL.sub("", text), unframe=False)
