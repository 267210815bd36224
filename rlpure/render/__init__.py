"""Renderers: chat messages <-> token sequences for sampling, parsing and supervised training.

Pure functions of (tokenizer, messages); no IO. One module per format:

- `_role_colon` — `RoleColonRenderer`, `Role: content` turns (DeepSeek R1-Zero; base models).
- `_chatml` — `ChatMLRenderer`, `<|im_start|>role\\n...<|im_end|>` (SmolLM2-Instruct's
  template; Hermes `<tool_call>` tool use).
- `_qwen3` — `Qwen3Renderer` (thinking on), `Qwen3DisableThinkingRenderer` and
  `Qwen3InstructRenderer` (2507 Instruct, no `<think>`).
- `_llama3` — `Llama3Renderer` (Llama 3 Instruct headers, no tool-call syntax).
- `_tools` — the `<tool_call>` format, response block parsing, tool declarations.
- `_chat` — the prompt / supervised-example assembly the chat formats share (conventions:
  alignment, weights, the prefix property); `_types` — the records and checks.

Every renderer has `build_generation_prompt(messages, *, role)`, `get_stop_sequences()`,
`parse_response(tokens) -> ParsedResponse` and `build_supervised_example(messages, *,
train_on, trainable_M) -> SupervisedExample`, and says by `has_extension_property` whether each
turn's prompt extends the previous prompt plus its sampled turn (so one datum covers the
episode). `qwen3` (stripping earlier thinking, as its template does) is the one that does not.
"""

from __future__ import annotations

from rlpure.render._chat import RenderContext
from rlpure.render._chatml import SMOLLM2_DEFAULT_SYSTEM_PROMPT, ChatMLRenderer
from rlpure.render._llama3 import Llama3Renderer
from rlpure.render._qwen3 import (
    Qwen3DisableThinkingRenderer,
    Qwen3InstructRenderer,
    Qwen3Renderer,
)
from rlpure.render._role_colon import RoleColonRenderer
from rlpure.render._tools import (
    format_tool_calls,
    parse_content_blocks,
    parse_tool_call_json,
    tools_system_prompt,
)
from rlpure.render._types import (
    ChatMessage,
    ContentPart,
    Message,
    ParsedResponse,
    Renderer,
    SupervisedExample,
    Termination,
    TextPart,
    ThinkingPart,
    TokenizerLike,
    ToolCall,
    TrainOn,
    UnparsedToolCall,
)

__all__ = [
    "RENDERER_NAMES",
    "SMOLLM2_DEFAULT_SYSTEM_PROMPT",
    "ChatMLRenderer",
    "ChatMessage",
    "ContentPart",
    "Llama3Renderer",
    "Message",
    "ParsedResponse",
    "Qwen3DisableThinkingRenderer",
    "Qwen3InstructRenderer",
    "Qwen3Renderer",
    "RenderContext",
    "Renderer",
    "RoleColonRenderer",
    "SupervisedExample",
    "Termination",
    "TextPart",
    "ThinkingPart",
    "TokenizerLike",
    "ToolCall",
    "TrainOn",
    "UnparsedToolCall",
    "format_tool_calls",
    "get_renderer",
    "parse_content_blocks",
    "parse_tool_call_json",
    "tools_system_prompt",
]

RENDERER_NAMES: tuple[str, ...] = (
    "role_colon",
    "chatml",
    "smollm2",
    "qwen3",
    "qwen3_disable_thinking",
    "qwen3_instruct",
    "llama3",
)
"""The names `get_renderer` knows (`smollm2` is ChatML with SmolLM2's default system prompt)."""


def get_renderer(name: str, tokenizer: TokenizerLike) -> Renderer:
    """The renderer called `name` (one of `RENDERER_NAMES`) over `tokenizer`.

    Raises:
        ValueError: for an unknown name, listing the known ones.

    Examples:
        >>> from rlpure.render._testing import SpecialWordTokenizer
        >>> get_renderer("qwen3", SpecialWordTokenizer()).has_extension_property
        False
    """
    if name == "role_colon":
        return RoleColonRenderer(tokenizer)
    if name == "chatml":
        return ChatMLRenderer(tokenizer)
    if name == "smollm2":
        return ChatMLRenderer(tokenizer, default_system_prompt=SMOLLM2_DEFAULT_SYSTEM_PROMPT)
    if name == "qwen3":
        return Qwen3Renderer(tokenizer)
    if name == "qwen3_disable_thinking":
        return Qwen3DisableThinkingRenderer(tokenizer)
    if name == "qwen3_instruct":
        return Qwen3InstructRenderer(tokenizer)
    if name == "llama3":
        return Llama3Renderer(tokenizer)
    raise ValueError(f"get_renderer: unknown renderer {name!r}; known: {RENDERER_NAMES}")
