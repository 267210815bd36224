"""`tinker_cookbook.tool_use.agent_tool_message_env`: re-exported from `shell.agents._tool_env`."""

from rlpure.records import (
    StopReason,
)
from shell.agents._message_env import (
    EnvFromMessageEnv,
    MessageEnv,
    MessageStepResult,
)
from shell.agents._tool_env import (
    AgentToolMessageEnv,
    RewardFn,
    RewardResult,
    build_agent_tool_env,
)
from shell.agents._tool_types import (
    Tool,
    ToolResult,
)
from shell.agents._tools import (
    handle_tool_call,
)
from shell.chat._base import (
    PARSE_FAILURE_DETAIL_MAX_CHARS,
    Message,
    Renderer,
    ToolCall,
    UnparsedToolCall,
    format_content_as_string,
    get_text_content,
)
from shell.rollouts import (
    ParseErrorPolicy,
    RolloutConfig,
    TerminationRewardPolicy,
    ToolExecution,
    default_rollout_config_for_model,
)

__all__ = [
    "PARSE_FAILURE_DETAIL_MAX_CHARS",
    "AgentToolMessageEnv",
    "EnvFromMessageEnv",
    "Message",
    "MessageEnv",
    "MessageStepResult",
    "ParseErrorPolicy",
    "Renderer",
    "RewardFn",
    "RewardResult",
    "RolloutConfig",
    "StopReason",
    "TerminationRewardPolicy",
    "Tool",
    "ToolCall",
    "ToolExecution",
    "ToolResult",
    "UnparsedToolCall",
    "build_agent_tool_env",
    "default_rollout_config_for_model",
    "format_content_as_string",
    "get_text_content",
    "handle_tool_call",
]
