"""tinker-cookbook 0.6.1's `utils.logtree_formatters`: HTML formatters for `logtree.log_formatter`.

`ConversationFormatter(messages=...)` renders chat messages (the cookbook's `Message` dicts:
`role`, `content` as a string or a list of typed parts) with the cookbook's HTML classes, and
exports them to the trace JSON as `{"type": "conversation", "messages": [...]}`.

Deliberate difference: the cookbook raises on an `audio` content part (a valid part type) while
logging it, which aborts the rollout that logs; here it renders as `[Audio]` and exports as
`{"type": "audio"}`. Unknown part types still raise `RendererError`.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from shell.errors import RendererError

__all__ = ["CONVERSATION_CSS", "ConversationFormatter", "message_to_jsonable"]


def _part_type(part: Mapping[str, Any]) -> str:
    kind = part.get("type")
    if not isinstance(kind, str):
        raise RendererError(f"content part has no string 'type': {part!r}")
    return kind


def _content_html(content: str | Sequence[Mapping[str, Any]]) -> str:
    if isinstance(content, str):
        return f'<span class="lt-text-part">{html.escape(content)}</span>'
    pieces: list[str] = []
    for part in content:
        kind = _part_type(part)
        if kind == "text":
            pieces.append(f'<span class="lt-text-part">{html.escape(part["text"])}</span>')
        elif kind == "thinking":
            pieces.append(
                '<details class="lt-thinking-part"><summary>💭 Thinking</summary>'
                f"<pre>{html.escape(part['thinking'])}</pre></details>"
            )
        elif kind == "tool_call":
            call = part["tool_call"]
            pieces.append(
                '<div class="lt-tool-call-part"><span class="lt-tool-call-label">🔧 Tool Call:'
                f"</span> <code>{html.escape(call.function.name)}"
                f"({html.escape(call.function.arguments)})</code></div>"
            )
        elif kind == "unparsed_tool_call":
            pieces.append(
                '<div class="lt-unparsed-tool-call-part"><span class="lt-tool-call-label">'
                f"⚠️ Unparsed Tool Call:</span> <code>{html.escape(part['raw_text'])}</code>"
                f'<div class="lt-error">{html.escape(part["error"])}</div></div>'
            )
        elif kind == "image":
            pieces.append('<span class="lt-image-part">🖼️ [Image]</span>')
        elif kind == "audio":
            pieces.append('<span class="lt-image-part">🔊 [Audio]</span>')
        else:
            raise RendererError(f"Unknown content part type: {kind}")
    return "\n".join(pieces)


def _content_jsonable(content: str | Sequence[Mapping[str, Any]]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    out: list[dict[str, Any]] = []
    for part in content:
        kind = _part_type(part)
        if kind == "text":
            out.append({"type": "text", "text": part["text"]})
        elif kind == "thinking":
            out.append({"type": "thinking", "thinking": part["thinking"]})
        elif kind == "image":
            image = part.get("image")  # a URL string is kept, an image object is not
            out.append(
                {"type": "image", "image": image} if isinstance(image, str) else {"type": "image"}
            )
        elif kind == "audio":
            out.append({"type": "audio"})
        else:
            raise RendererError(f"Unknown content part type: {kind}")
    return out


def _jsonable_object(value: Any) -> Any:
    """A tool call as JSON-ready builtins: pydantic (`model_dump`), msgspec or a plain dict."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    return msgspec.to_builtins(value)


def message_to_jsonable(message: Mapping[str, Any]) -> dict[str, Any]:
    """`message` as JSON-ready builtins, keeping `tool_calls`, `unparsed_tool_calls`,
    `trainable`, `tool_call_id` and `name` when present (the cookbook's key order)."""
    out: dict[str, Any] = {
        "role": message["role"],
        "content": _content_jsonable(message["content"]),
    }
    for key in ("tool_calls", "unparsed_tool_calls"):
        if key in message:
            out[key] = [_jsonable_object(call) for call in message[key]]
    for key in ("trainable", "tool_call_id", "name"):
        if key in message:
            out[key] = message[key]
    return out


@dataclass
class ConversationFormatter:
    """Renders `messages` as a conversation, one coloured block per role.

    Attributes:
        messages: the chat messages, each with `role` and `content`.
    """

    messages: Sequence[Mapping[str, Any]]

    def to_html(self) -> str:
        """The conversation's HTML (`lt-conversation`, one `lt-message-{role}` per message)."""
        lines = ['<div class="lt-conversation">']
        for message in self.messages:
            role = html.escape(message["role"])
            lines.append(f'  <div class="lt-message lt-message-{role}">')
            lines.append(f'    <span class="lt-message-role">{role}:</span>')
            lines.append(
                f'    <div class="lt-message-content">{_content_html(message["content"])}</div>'
            )
            lines.append("  </div>")
        lines.append("</div>")
        return "\n".join(lines)

    def to_data(self) -> dict[str, Any]:
        """`{"type": "conversation", "messages": [...]}` for the trace JSON."""
        return {
            "type": "conversation",
            "messages": [message_to_jsonable(message) for message in self.messages],
        }

    def get_css(self) -> str:
        """`CONVERSATION_CSS`."""
        return CONVERSATION_CSS


CONVERSATION_CSS = """
/* Conversation formatting */
.lt-conversation { display: flex; flex-direction: column; gap: 0.35rem; margin: 0.25rem 0; }
.lt-message { padding: 0.5rem 0.6rem; border-radius: 6px; line-height: 1.4;
  border-left: 3px solid var(--lt-accent, #2563eb); background: var(--lt-bg, #f9fafb); }
.lt-message-role { font-weight: 600; color: var(--lt-accent, #2563eb); display: inline-block;
  min-width: 64px; }
.lt-message-content { white-space: pre-wrap; overflow-wrap: break-word; }
.lt-message-user { background: #e3f2fd; border-left-color: #1976d2; }
.lt-message-user .lt-message-role { color: #1565c0; }
.lt-message-assistant { background: #f3e5f5; border-left-color: #7b1fa2; }
.lt-message-assistant .lt-message-role { color: #6a1b9a; }
.lt-message-system { background: #fff3e0; border-left-color: #f57c00; }
.lt-message-system .lt-message-role { color: #e65100; }
.lt-message-tool { background: #e8f5e9; border-left-color: #388e3c; }
.lt-message-tool .lt-message-role { color: #2e7d32; }
.lt-text-part { display: block; }
.lt-thinking-part { margin: 0.5rem 0; padding: 0.5rem; background: #fef3c7;
  border: 1px solid #fbbf24; border-radius: 4px; }
.lt-thinking-part summary { cursor: pointer; font-weight: 500; color: #92400e; }
.lt-thinking-part pre { margin: 0.5rem 0 0; padding: 0.5rem; background: #fffbeb;
  border-radius: 4px; font-size: 0.875rem; overflow-x: auto; white-space: pre-wrap; }
.lt-tool-call-part, .lt-unparsed-tool-call-part { margin: 0.5rem 0; padding: 0.5rem;
  border-radius: 4px; background: #dbeafe; border: 1px solid #3b82f6; }
.lt-unparsed-tool-call-part { background: #fee2e2; border-color: #ef4444; }
.lt-tool-call-label { font-weight: 500; color: #1e40af; }
.lt-unparsed-tool-call-part .lt-tool-call-label { color: #991b1b; }
.lt-tool-call-part code, .lt-unparsed-tool-call-part code { display: block; margin-top: 0.25rem;
  padding: 0.25rem 0.5rem; background: #eff6ff; border-radius: 2px; font-size: 0.875rem;
  overflow-x: auto; }
.lt-error { margin-top: 0.25rem; font-size: 0.875rem; color: #dc2626; }
.lt-image-part { display: inline-block; padding: 0.25rem 0.5rem; background: #e0e7ff;
  border-radius: 4px; color: #3730a3; }
"""
"""CSS for `ConversationFormatter`'s HTML."""
