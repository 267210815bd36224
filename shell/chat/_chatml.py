"""A generic ChatML renderer (`<|im_start|>role\\n...<|im_end|>`), over `rlpure.render`.

Not a cookbook module (0.6.1 has no generic ChatML renderer): `get_renderer("chatml", ...)`
gives `ChatMLRenderer`, and `get_renderer("smollm2", ...)` the same with SmolLM2-Instruct's
default system prompt, string-exact against SmolLM2's own chat template for generation
prompts (`tests/parity/test_renderer_parity.py`). Layout, tool calls and parsing:
`rlpure.render._chatml`.
"""

from __future__ import annotations

from typing import Any

from rlpure import render
from shell.chat._adapter import CoreChatRenderer, as_renderer_error, content_encoder
from shell.chat._base import Renderer, _register_builtin_renderer

__all__ = ["SMOLLM2_DEFAULT_SYSTEM_PROMPT", "ChatMLRenderer"]

SMOLLM2_DEFAULT_SYSTEM_PROMPT = render.SMOLLM2_DEFAULT_SYSTEM_PROMPT
"""The system message SmolLM2-Instruct's template adds when a conversation has none."""


class ChatMLRenderer(CoreChatRenderer):
    """ChatML turns, Hermes `<tool_call>` tool use; the prefix property holds.

    Args:
        tokenizer: a tokenizer with `<|im_start|>` and `<|im_end|>` as single tokens.
        default_system_prompt: system text put first when the conversation has none.
    """

    def __init__(self, tokenizer: Any, default_system_prompt: str | None = None) -> None:
        super().__init__(tokenizer)
        self.default_system_prompt = default_system_prompt
        with as_renderer_error():
            self._core = render.ChatMLRenderer(
                tokenizer,
                default_system_prompt=default_system_prompt,
                encode_content=content_encoder(tokenizer),
            )


def _chatml(tokenizer: Any, image_processor: Any) -> Renderer:
    return ChatMLRenderer(tokenizer)


def _smollm2(tokenizer: Any, image_processor: Any) -> Renderer:
    return ChatMLRenderer(tokenizer, default_system_prompt=SMOLLM2_DEFAULT_SYSTEM_PROMPT)


_register_builtin_renderer("chatml", _chatml)
_register_builtin_renderer("smollm2", _smollm2)
