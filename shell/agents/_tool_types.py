"""The cookbook's `tinker_cookbook.tool_use.types`: tool inputs, results and the `Tool` protocol.

`ToolInput` and `ToolResult` are `msgspec.Struct`s with the cookbook dataclasses' fields and
defaults (positional and keyword construction alike); `ToolSpec` is the renderers' `ToolSpec`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import msgspec

from shell.chat._base import Message, ToolSpec

__all__ = ["Tool", "ToolInput", "ToolResult", "ToolSpec"]


class ToolInput(msgspec.Struct):
    """One tool invocation's input.

    Attributes:
        arguments: the decoded JSON arguments the model passed.
        call_id: the tool call's id, when the model gave one.
    """

    arguments: dict[str, Any]
    call_id: str | None = None


class ToolResult(msgspec.Struct):
    """What a tool returns.

    Attributes:
        messages: the messages to append to the conversation (usually one `tool` message).
        should_stop: whether the episode should end after this call.
        metrics: the call's metrics.
        metadata: diagnostics; an error result holds `{"error": <error type>}`.
    """

    messages: list[Message]
    should_stop: bool = False
    metrics: dict[str, float] = msgspec.field(default_factory=dict)
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


@runtime_checkable
class Tool(Protocol):
    """A tool an agent can call: a name, a description, a JSON schema and an async `run`."""

    @property
    def name(self) -> str:
        """The tool's name, as the model calls it."""
        ...

    @property
    def description(self) -> str:
        """The description shown to the model."""
        ...

    @property
    def parameters_schema(self) -> dict[str, Any]:
        """The JSON Schema of the tool's arguments, shown to the model."""
        ...

    async def run(self, input: ToolInput) -> ToolResult:
        """Runs the tool on validated arguments."""
        ...

    def to_spec(self) -> ToolSpec:
        """The tool as a renderer `ToolSpec` (name, description, parameters)."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters_schema,
        }
