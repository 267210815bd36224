"""`tinker_cookbook.renderers.chatml`: re-exported from `shell.chat._chatml`."""

from shell.chat._adapter import (
    CoreChatRenderer,
    as_renderer_error,
    content_encoder,
)
from shell.chat._base import (
    Renderer,
)
from shell.chat._chatml import (
    SMOLLM2_DEFAULT_SYSTEM_PROMPT,
    ChatMLRenderer,
)

__all__ = [
    "SMOLLM2_DEFAULT_SYSTEM_PROMPT",
    "ChatMLRenderer",
    "CoreChatRenderer",
    "Renderer",
    "as_renderer_error",
    "content_encoder",
]
