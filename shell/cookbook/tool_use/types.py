"""`tinker_cookbook.tool_use.types`: re-exported from `shell.agents._tool_types`."""

from shell.agents._tool_types import (
    Tool,
    ToolInput,
    ToolResult,
    ToolSpec,
)
from shell.chat._base import (
    Message,
)

__all__ = [
    "Message",
    "Tool",
    "ToolInput",
    "ToolResult",
    "ToolSpec",
]
