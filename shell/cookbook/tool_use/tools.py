"""`tinker_cookbook.tool_use.tools`: re-exported from `shell.agents._tools`."""

from shell.agents._tool_types import (
    Tool,
    ToolInput,
    ToolResult,
)
from shell.agents._tools import (
    FunctionTool,
    error_tool_result,
    handle_tool_call,
    simple_tool_result,
    tool,
)
from shell.chat._base import (
    ContentPart,
    ToolCall,
    ToolSpec,
)

__all__ = [
    "ContentPart",
    "FunctionTool",
    "Tool",
    "ToolCall",
    "ToolInput",
    "ToolResult",
    "ToolSpec",
    "error_tool_result",
    "handle_tool_call",
    "simple_tool_result",
    "tool",
]
