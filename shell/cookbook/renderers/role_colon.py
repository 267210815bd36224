"""`tinker_cookbook.renderers.role_colon`: re-exported from `shell.chat._role_colon`."""

from shell.chat._base import (
    Message,
    ParseResult,
    ParseTermination,
    Renderer,
    ToolSpec,
    TrainOnWhat,
    ensure_text,
)
from shell.chat._role_colon import (
    RoleColonRenderer,
)

__all__ = [
    "Message",
    "ParseResult",
    "ParseTermination",
    "Renderer",
    "RoleColonRenderer",
    "ToolSpec",
    "TrainOnWhat",
    "ensure_text",
]
