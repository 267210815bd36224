"""The cookbook's Qwen3 renderers (`tinker_cookbook.renderers.qwen3`), over `rlpure.render`.

`Qwen3Renderer` (`get_renderer("qwen3", ...)`, thinking on),
`Qwen3DisableThinkingRenderer` (`"qwen3_disable_thinking"`) and `Qwen3InstructRenderer`
(`"qwen3_instruct"`, the 2507 Instruct models: no `<think>` framing). Tokens are
`rlpure.render.Qwen3Renderer`'s (layout, thinking framing, tool calls and where the prefix
property breaks: its module docstring); `shell.chat._adapter` converts types.

Deliberate differences from the cookbook (each pinned in `tests/parity/test_renderer_parity.py`):
- Bad messages raise `RendererError` naming the message index and field: an unknown role, a
  non-string content, an image part (the cookbook's text renderer silently drops it), a
  tool call whose arguments are not a JSON object.
- `create_conversation_prefix_with_tools([], system_prompt)` returns the system prompt alone
  (the cookbook appends `"\\n\\n"` to it, and returns an empty system message without one).
- No streaming parser (`parse_response_streaming`) and no `to_openai_message` reasoning split.
- The one setting a caller may change after construction is `strip_thinking_from_history`;
  a subclass's `frames_thinking` and the cookbook's overridable steps (`render_message`,
  `_output_is_trained`) are not read: the core renders.
"""

from __future__ import annotations

from typing import Any

from rlpure import render
from shell.chat._adapter import CoreChatRenderer, as_renderer_error, content_encoder
from shell.chat._base import Renderer, _register_builtin_renderer

__all__ = ["Qwen3DisableThinkingRenderer", "Qwen3InstructRenderer", "Qwen3Renderer"]


class Qwen3Renderer(CoreChatRenderer):
    """Qwen3 with thinking on (`<think>` framed on the produced turn, stripped from history).

    Args:
        tokenizer: a Qwen3 tokenizer (or any with `<|im_start|>`/`<|im_end|>` single tokens).
        strip_thinking_from_history: as Qwen3's template (True); False keeps earlier thinking
            and gives the prefix property (`has_extension_property`).
    """

    frames_thinking = True

    def __init__(self, tokenizer: Any, strip_thinking_from_history: bool = True) -> None:
        super().__init__(tokenizer)
        self.strip_thinking_from_history = strip_thinking_from_history

    @property
    def strip_thinking_from_history(self) -> bool:
        """Whether earlier turns' thinking is dropped; set it at any time (as the cookbook's
        attribute, read on every call), the renderer follows."""
        return self._strip_thinking

    @strip_thinking_from_history.setter
    def strip_thinking_from_history(self, strip: bool) -> None:
        self._strip_thinking = bool(strip)
        with as_renderer_error():
            self._core = self._make_core(self.tokenizer, self._strip_thinking)

    def _make_core(self, tokenizer: Any, strip: bool) -> render.Qwen3Renderer:
        return render.Qwen3Renderer(
            tokenizer, strip_thinking_from_history=strip, encode_content=content_encoder(tokenizer)
        )


class Qwen3DisableThinkingRenderer(Qwen3Renderer):
    """Qwen3 with thinking off: the generation prompt ends with an empty think block."""

    disables_thinking = True

    def _make_core(self, tokenizer: Any, strip: bool) -> render.Qwen3Renderer:
        return render.Qwen3DisableThinkingRenderer(
            tokenizer, strip_thinking_from_history=strip, encode_content=content_encoder(tokenizer)
        )


class Qwen3InstructRenderer(Qwen3Renderer):
    """Qwen3 Instruct 2507: the Qwen3 layout without `<think>` framing or an empty block."""

    frames_thinking = False

    def _make_core(self, tokenizer: Any, strip: bool) -> render.Qwen3Renderer:
        return render.Qwen3InstructRenderer(
            tokenizer, strip_thinking_from_history=strip, encode_content=content_encoder(tokenizer)
        )


def _qwen3(tokenizer: Any, image_processor: Any) -> Renderer:
    return Qwen3Renderer(tokenizer)


def _qwen3_disable_thinking(tokenizer: Any, image_processor: Any) -> Renderer:
    return Qwen3DisableThinkingRenderer(tokenizer)


def _qwen3_instruct(tokenizer: Any, image_processor: Any) -> Renderer:
    return Qwen3InstructRenderer(tokenizer)


_register_builtin_renderer("qwen3", _qwen3)
_register_builtin_renderer("qwen3_instruct", _qwen3_instruct)
_register_builtin_renderer("qwen3_disable_thinking", _qwen3_disable_thinking)
