"""`tinker_cookbook.renderers.llama3`: re-exported from `shell.chat._llama3`."""

from shell.chat._adapter import (
    CoreChatRenderer,
    as_renderer_error,
)
from shell.chat._base import (
    Renderer,
)
from shell.chat._llama3 import (
    Llama3Renderer,
)

__all__ = [
    "CoreChatRenderer",
    "Llama3Renderer",
    "Renderer",
    "as_renderer_error",
]
