"""`tinker_cookbook.renderers.qwen3`: re-exported from `shell.chat._qwen3`."""

from shell.chat._adapter import (
    CoreChatRenderer,
    as_renderer_error,
    content_encoder,
)
from shell.chat._base import (
    Renderer,
)
from shell.chat._qwen3 import (
    Qwen3DisableThinkingRenderer,
    Qwen3InstructRenderer,
    Qwen3Renderer,
)

__all__ = [
    "CoreChatRenderer",
    "Qwen3DisableThinkingRenderer",
    "Qwen3InstructRenderer",
    "Qwen3Renderer",
    "Renderer",
    "as_renderer_error",
    "content_encoder",
]
