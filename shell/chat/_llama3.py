"""The cookbook's Llama 3 renderer (`tinker_cookbook.renderers.llama3`), over `rlpure.render`.

`Llama3Renderer` (`get_renderer("llama3", ...)`): tokens are `rlpure.render.Llama3Renderer`'s
(layout in its module docstring); `shell.chat._adapter` converts types.

Deliberate differences from the cookbook (pinned in `tests/parity/test_renderer_parity.py`):
- An assistant message with `tool_calls` is refused with a `RendererError` naming it (Llama 3
  has no delimited tool-call syntax; the cookbook drops the calls silently and trains on the
  turn without them). Thinking parts are refused the same way (the cookbook's `ensure_text`
  raises too); several text parts are joined (the cookbook refuses them).
"""

from __future__ import annotations

from typing import Any

from rlpure import render
from shell.chat._adapter import CoreChatRenderer, as_renderer_error
from shell.chat._base import Renderer, _register_builtin_renderer

__all__ = ["Llama3Renderer"]


class Llama3Renderer(CoreChatRenderer):
    """Llama 3 Instruct headers, `<|eot_id|>` ends a turn; the prefix property holds."""

    supports_tools = False

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        with as_renderer_error():
            self._core = render.Llama3Renderer(tokenizer)

    @property
    def _bos_tokens(self) -> list[int]:
        return [
            int(t) for t in self.tokenizer.encode("<|begin_of_text|>", add_special_tokens=False)
        ]


def _llama3(tokenizer: Any, image_processor: Any) -> Renderer:
    return Llama3Renderer(tokenizer)


_register_builtin_renderer("llama3", _llama3)
