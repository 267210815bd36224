"""The cookbook's `tinker_cookbook.tool_use`: tools for LLM agents and the env that runs them.

`@tool` functions (`FunctionTool`), `handle_tool_call`, the result helpers, the `Tool` protocol
and records (`shell.tool_use.types`), and `AgentToolMessageEnv` / `build_agent_tool_env`
(`shell.tool_use.agent_tool_message_env`), under the cookbook's names so cookbook code ports by
the import-prefix rewrite. Bad model output (unknown tool, malformed JSON, wrong argument
types, a raising or — with a timeout — hanging tool) becomes an error tool message, never an
exception; the modules' docstrings list the additions to the cookbook.
"""

from shell.tool_use.agent_tool_message_env import AgentToolMessageEnv, build_agent_tool_env
from shell.tool_use.tools import (
    FunctionTool,
    error_tool_result,
    handle_tool_call,
    simple_tool_result,
    tool,
)
from shell.tool_use.types import Tool, ToolInput, ToolResult, ToolSpec

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
