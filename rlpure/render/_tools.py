"""Tool calls in Hermes/Qwen syntax: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.

Conventions:
- A call renders as `<tool_call>\\n` + `json.dumps({"name": n, "arguments": a})` + `\\n</tool_call>`
  with `json.dumps`' default separators (`", "`, `": "`) and ASCII escaping, several calls
  joined by `"\\n"` (the cookbook's `qwen3` layout, which follows Qwen3's chat template).
- Parsing a response finds `<think>...</think>` and `<tool_call>...</tool_call>` blocks in one
  left-to-right pass (non-greedy, across lines). Text between blocks is kept exactly; an empty
  `<think></think>` yields no part. A tool block parses into a `ToolCall` when its body is a
  JSON object with a string `name` and an object `arguments` (an `id` that is not a string is
  dropped), else into an `UnparsedToolCall` with the cookbook's error wording. An opening tag
  without its closing tag is an `UnparsedToolCall` too ("unterminated tool block").
- Tool declarations (`tools_system_prompt`) are the cookbook's Qwen3 text: one
  `{"type": "function", "function": spec}` JSON line per tool inside `<tools></tools>`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from rlpure.render._types import ContentPart, ToolCall, UnparsedToolCall

__all__ = [
    "ContentBlocks",
    "format_tool_calls",
    "parse_content_blocks",
    "parse_tool_call_json",
    "tools_system_prompt",
    "unterminated_tool_block",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
UNTERMINATED_TOOL_BLOCK_ERROR = "unterminated tool block"
_DETAIL_MAX_CHARS = 16384
_BLOCKS = re.compile(r"<think>(.*?)</think>|<tool_call>(.*?)</tool_call>", re.DOTALL)


class ContentBlocks(NamedTuple):
    """A response split into content parts and tool calls (both in order of appearance)."""

    parts: tuple[ContentPart, ...]
    calls: tuple[ToolCall | UnparsedToolCall, ...]


def format_tool_call(call: ToolCall) -> str:
    """One call as its `<tool_call>` block.

    Examples:
        >>> format_tool_call(ToolCall(name="add", arguments='{"a": 1}'))
        '<tool_call>\\n{"name": "add", "arguments": {"a": 1}}\\n</tool_call>'
    """
    payload = {"name": call.name, "arguments": json.loads(call.arguments)}
    return f"{TOOL_CALL_OPEN}\n{json.dumps(payload)}\n{TOOL_CALL_CLOSE}"


def format_tool_calls(calls: Sequence[ToolCall]) -> str:
    """Calls as `<tool_call>` blocks joined by `"\\n"` (no separator before the first)."""
    return "\n".join(format_tool_call(call) for call in calls)


def parse_tool_call_json(body: str, raw_text: str) -> ToolCall | UnparsedToolCall:
    """The body of a `<tool_call>` block as a call, or why it is not one.

    Args:
        body: the text between the tags.
        raw_text: the whole block, tags included (kept on failure).
    """
    try:
        value = json.loads(body.strip())
    except json.JSONDecodeError as error:
        return UnparsedToolCall(raw_text=raw_text, error=f"Invalid JSON: {error}")
    if not isinstance(value, dict):
        return UnparsedToolCall(raw_text=raw_text, error="Tool call is not a JSON object")
    name, arguments, call_id = value.get("name"), value.get("arguments"), value.get("id")
    if not isinstance(name, str):
        return UnparsedToolCall(raw_text=raw_text, error="Missing or invalid 'name' field")
    if not isinstance(arguments, dict):
        return UnparsedToolCall(raw_text=raw_text, error="Missing or invalid 'arguments' field")
    return ToolCall(
        name=name,
        arguments=json.dumps(arguments),
        id=call_id if isinstance(call_id, str) else None,
    )


def parse_content_blocks(content: str) -> ContentBlocks | None:
    """`<think>` and `<tool_call>` blocks of `content`, or None when it has neither tag.

    Examples:
        >>> blocks = parse_content_blocks('<think>hm</think>ok')
        >>> blocks.parts
        ({'type': 'thinking', 'thinking': 'hm'}, {'type': 'text', 'text': 'ok'})
    """
    if "<think>" not in content and TOOL_CALL_OPEN not in content:
        return None
    parts: list[ContentPart] = []
    calls: list[ToolCall | UnparsedToolCall] = []
    position = 0
    for match in _BLOCKS.finditer(content):
        before = content[position : match.start()]
        if before:
            parts.append({"type": "text", "text": before})
        if match.group(1) is not None:
            if match.group(1):
                parts.append({"type": "thinking", "thinking": match.group(1)})
        else:
            calls.append(parse_tool_call_json(match.group(2), match.group(0)))
        position = match.end()
    rest = content[position:]
    if rest:
        parts.append({"type": "text", "text": rest})
    return ContentBlocks(tuple(parts), tuple(calls))


def unterminated_tool_block(content: str) -> UnparsedToolCall | None:
    """A `<tool_call>` opened more often than closed, from its last opening; else None."""
    opens = content.count(TOOL_CALL_OPEN)
    if opens == 0 or opens <= content.count(TOOL_CALL_CLOSE):
        return None
    return UnparsedToolCall(
        raw_text=content[content.rfind(TOOL_CALL_OPEN) :][:_DETAIL_MAX_CHARS],
        error=(
            f"{UNTERMINATED_TOOL_BLOCK_ERROR}: '{TOOL_CALL_OPEN}' opened without a "
            f"matching '{TOOL_CALL_CLOSE}'"
        ),
    )


def tools_system_prompt(tools: Sequence[Mapping[str, Any]], system_prompt: str = "") -> str:
    """The system message content that declares `tools` (the cookbook's Qwen3 wording).

    Args:
        tools: OpenAI-style specs (`name`, `description`, `parameters`).
        system_prompt: text put before the declaration, separated by a blank line.

    Returns:
        `system_prompt` alone when `tools` is empty.
    """
    if not tools:
        return system_prompt
    lines = "\n".join(
        json.dumps({"type": "function", "function": dict(tool)}, separators=(", ", ": "))
        for tool in tools
    )
    text = (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
    return f"{system_prompt}\n\n{text}" if system_prompt else text
