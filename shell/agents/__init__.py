"""Agents: message-level envs and the tools they call.

- `MessageEnv` / `MessageStepResult` / `EnvFromMessageEnv`: an env that speaks chat messages,
  wrapped as a token-level `shell.env.Env` through a renderer (`_message_env`).
- `@tool` functions (`FunctionTool`), `handle_tool_call` and the result helpers (`_tools`), the
  `Tool` protocol and records (`_tool_types`), and `AgentToolMessageEnv` /
  `build_agent_tool_env`, the env that runs a tool-calling agent (`_tool_env`). Bad model
  output (unknown tool, malformed JSON, wrong argument types, a raising or — with a timeout —
  hanging tool) becomes an error tool message, never an exception.
"""

from shell.agents._message_env import EnvFromMessageEnv, MessageEnv, MessageStepResult
from shell.agents._tool_env import AgentToolMessageEnv, build_agent_tool_env
from shell.agents._tool_types import Tool, ToolInput, ToolResult, ToolSpec
from shell.agents._tools import (
    FunctionTool,
    error_tool_result,
    handle_tool_call,
    simple_tool_result,
    tool,
)

__all__ = [
    "AgentToolMessageEnv",
    "EnvFromMessageEnv",
    "FunctionTool",
    "MessageEnv",
    "MessageStepResult",
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
