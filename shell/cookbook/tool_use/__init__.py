"""`tinker_cookbook.tool_use`: re-exported from `shell.agents`."""

from shell.agents import (
    AgentToolMessageEnv,
    FunctionTool,
    Tool,
    ToolInput,
    ToolResult,
    ToolSpec,
    build_agent_tool_env,
    error_tool_result,
    handle_tool_call,
    simple_tool_result,
    tool,
)

__all__ = [
    "AgentToolMessageEnv",
    "FunctionTool",
    "Tool",
    "ToolInput",
    "ToolResult",
    "ToolSpec",
    "build_agent_tool_env",
    "error_tool_result",
    "handle_tool_call",
    "simple_tool_result",
    "tool",
]
