"""Renderers with tinker-cookbook 0.6.1's API (`tinker_cookbook.renderers`): messages ↔ tokens.

`from tinker_cookbook import renderers` ports as `from shell import renderers`, and
`tinker_cookbook.renderers.base` as `shell.chat._base`. The token maths is
`rlpure.render`'s; these modules convert types at the edge (`tinker.ModelInput` out, the
cookbook's `Message` dicts in and out). Conventions and the deliberate differences from the
cookbook are in `shell.chat._base` and `shell.chat._role_colon`.

- `base` — `Message` and its content parts, `ToolCall`, `TrainOnWhat`, `ParseTermination`,
  `ParseResult`, `Renderer`, `ensure_text`, `get_text_content`, `classify_parse_failure`,
  `get_renderer` and the custom-renderer registry.
- `role_colon` — `RoleColonRenderer` (`"role_colon"`).
- `qwen3` — `Qwen3Renderer` (`"qwen3"`), `Qwen3DisableThinkingRenderer`
  (`"qwen3_disable_thinking"`), `Qwen3InstructRenderer` (`"qwen3_instruct"`).
- `llama3` — `Llama3Renderer` (`"llama3"`).
- `chatml` — `ChatMLRenderer` (`"chatml"`; `"smollm2"` adds SmolLM2's default system prompt),
  not a cookbook module.

The cookbook's other chat renderers (`qwen3_5`, `deepseekv3`, `gpt_oss`, `kimi_k2`, ...) raise a
`RendererError` saying how to use the cookbook's meanwhile (the shell accepts their output).
"""

from shell.chat._base import (
    COOKBOOK_RENDERER_NAMES,
    AudioPart,
    Content,
    ContentPart,
    ImagePart,
    Message,
    ParseFailureKind,
    ParseResult,
    ParseTermination,
    Renderer,
    Role,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolSpec,
    TrainOnWhat,
    UnparsedToolCall,
    classify_parse_failure,
    ensure_list,
    ensure_text,
    format_content_as_string,
    get_registered_renderer_names,
    get_renderer,
    get_text_content,
    is_renderer_registered,
    register_renderer,
    unregister_renderer,
)
from shell.chat._chatml import ChatMLRenderer
from shell.chat._llama3 import Llama3Renderer
from shell.chat._qwen3 import (
    Qwen3DisableThinkingRenderer,
    Qwen3InstructRenderer,
    Qwen3Renderer,
)
from shell.chat._role_colon import RoleColonRenderer

__all__ = [
    "COOKBOOK_RENDERER_NAMES",
    "AudioPart",
    "ChatMLRenderer",
    "Content",
    "ContentPart",
    "ImagePart",
    "Llama3Renderer",
    "Message",
    "ParseFailureKind",
    "ParseResult",
    "ParseTermination",
    "Qwen3DisableThinkingRenderer",
    "Qwen3InstructRenderer",
    "Qwen3Renderer",
    "Renderer",
    "Role",
    "RoleColonRenderer",
    "TextPart",
    "ThinkingPart",
    "ToolCall",
    "ToolSpec",
    "TrainOnWhat",
    "UnparsedToolCall",
    "classify_parse_failure",
    "ensure_list",
    "ensure_text",
    "format_content_as_string",
    "get_registered_renderer_names",
    "get_renderer",
    "get_text_content",
    "is_renderer_registered",
    "register_renderer",
    "unregister_renderer",
]
