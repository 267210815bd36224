"""The cookbook's renderer API over an `rlpure.render` chat renderer: type conversion only.

Conventions:
- In: cookbook `Message` dicts. `content` (a string, or text/thinking parts) passes through;
  `tool_calls` become `rlpure.render.ToolCall` (from `shell.chat.ToolCall` or anything
  with `.function.name`, `.function.arguments` and `.id`, such as the cookbook's own); the
  keys the formats do not render (`trainable`, `tool_call_id`, `name`,
  `unparsed_tool_calls`) are read here or dropped.
- Out: `tinker.ModelInput` prompts (prefill appended), `ParseResult(message, termination)`
  with the cookbook's message shape (string content when the response had no blocks, else
  the list of parts; `tool_calls` / `unparsed_tool_calls` only when non-empty), float32 numpy
  weights.
- The core's `ValueError`s come out as `shell.errors.RendererError` (a `ValueError` too),
  with the same one-line message, so cookbook code that catches `RendererError` sees them.
- Content is encoded with special-token text spelled literally when the tokenizer is a Hugging
  Face fast tokenizer (a private copy of its backend with `encode_special_tokens=True`, as the
  cookbook's qwen3 does), so a user's `"<|im_end|>"` does not end their turn.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, cast

import numpy as np
import tinker

from rlpure import render
from shell import tokenizers
from shell.chat._base import (
    Content,
    ContentPart,
    Message,
    ParseResult,
    ParseTermination,
    Renderer,
    Role,
    ToolCall,
    ToolSpec,
    TrainOnWhat,
    UnparsedToolCall,
    _check_mapping,
)
from shell.errors import RendererError

__all__: list[str] = []


@contextmanager
def as_renderer_error() -> Iterator[None]:
    """Re-raises the core's `ValueError`/`TypeError` as a `RendererError` (same message)."""
    try:
        yield
    except RendererError:
        raise
    except (ValueError, TypeError) as error:
        raise RendererError(str(error)) from error


def content_encoder(tokenizer: Any) -> Callable[[str], Sequence[int]] | None:
    """An encoder that spells special-token text literally, or None when there is no way to."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "encode_special_tokens"):
        literal = copy.deepcopy(backend)
        literal.encode_special_tokens = True
        return lambda text: literal.encode(text, add_special_tokens=False).ids
    return None


def _core_tool_call(call: Any, *, where: str) -> render.ToolCall:
    if isinstance(call, render.ToolCall):
        return call
    function = getattr(call, "function", None)
    name, arguments = getattr(function, "name", None), getattr(function, "arguments", None)
    if not isinstance(name, str) or not isinstance(arguments, str):
        raise RendererError(
            f"{where}: expected a ToolCall with function.name and function.arguments strings, "
            f"got {type(call).__name__}"
        )
    call_id = getattr(call, "id", None)
    return render.ToolCall(name=name, arguments=arguments, id=call_id)


def core_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Cookbook messages as `rlpure.render.ChatMessage` dicts."""
    _check_mapping(messages)
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        converted: dict[str, Any] = {"role": message["role"], "content": message["content"]}
        if "tool_calls" in message:
            calls = message["tool_calls"]
            if isinstance(calls, (str, bytes, Mapping)) or not isinstance(calls, Sequence):
                raise RendererError(
                    f"messages[{i}]['tool_calls']: expected a list of ToolCall, "
                    f"got {type(calls).__name__}"
                )
            converted["tool_calls"] = [
                _core_tool_call(call, where=f"messages[{i}]['tool_calls'][{j}]")
                for j, call in enumerate(calls)
            ]
        out.append(converted)
    return out


def trainable_flags(messages: Sequence[Mapping[str, Any]], mode: TrainOnWhat) -> list[bool] | None:
    """The `trainable` flags `CUSTOMIZED` reads (refused, naming the messages, otherwise)."""
    flagged = [i for i, m in enumerate(messages) if "trainable" in m]
    if mode is TrainOnWhat.CUSTOMIZED:
        if len(flagged) != len(messages):
            missing = sorted(set(range(len(messages))) - set(flagged))
            raise RendererError(
                f"build_supervised_example: train_on_what=CUSTOMIZED needs a 'trainable' flag "
                f"on every message; messages{missing} have none"
            )
        return [bool(m["trainable"]) for m in messages]
    if flagged:
        raise RendererError(
            f"build_supervised_example: messages{flagged} carry 'trainable' flags, which only "
            f"train_on_what=CUSTOMIZED reads (got {mode.name})"
        )
    return None


def parse_train_on_what(value: TrainOnWhat | str) -> TrainOnWhat:
    """`value` as a `TrainOnWhat`, or a `RendererError` listing the known ones."""
    try:
        return TrainOnWhat(value)
    except ValueError:
        raise RendererError(
            f"build_supervised_example: unknown train_on_what {value!r}; "
            f"known: {[m.value for m in TrainOnWhat]}"
        ) from None


def cookbook_message(parsed: render.ParsedResponse) -> Message:
    """A parsed response in the cookbook's message shape."""
    content: Content = parsed.content
    if parsed.parts is not None:
        content = [cast(ContentPart, dict(part)) for part in parsed.parts]
    message: Message = {"role": "assistant", "content": content}
    if parsed.tool_calls:
        message["tool_calls"] = [
            ToolCall(
                function=ToolCall.FunctionBody(name=call.name, arguments=call.arguments),
                id=call.id,
            )
            for call in parsed.tool_calls
        ]
    if parsed.unparsed_tool_calls:
        message["unparsed_tool_calls"] = [
            UnparsedToolCall(raw_text=call.raw_text, error=call.error)
            for call in parsed.unparsed_tool_calls
        ]
    return message


class CoreChatRenderer(Renderer):
    """A shell `Renderer` over an `rlpure.render` chat renderer (`_core`)."""

    _core: render.Renderer
    supports_tools: bool = True

    def __repr__(self) -> str:
        return f"{type(self).__name__}(tokenizer={type(self.tokenizer).__name__})"

    @property
    def has_extension_property(self) -> bool:
        """Whether each turn's prompt extends the previous prompt plus its sampled turn."""
        return self._core.has_extension_property

    @property
    def _end_message_token(self) -> int:
        (token,) = self._core.get_stop_sequences()
        assert isinstance(token, int)
        return token

    def get_stop_sequences(self) -> list[int]:
        """The end-of-turn token id, as a one-element list."""
        return [int(t) for t in self._core.get_stop_sequences()]

    def build_generation_prompt(
        self, messages: list[Message], role: Role = "assistant", prefill: str | None = None
    ) -> tinker.ModelInput:
        """The prompt asking for the next `role` message, then `prefill`'s tokens when given."""
        with as_renderer_error():
            tokens = self._core.build_generation_prompt(core_messages(messages), role=role)
        ints = tokens.to_ints()
        if prefill:
            ints += tokenizers.encode_without_special_tokens(self.tokenizer, prefill)
        return tinker.ModelInput.from_ints(ints)

    def parse_response(self, response: Sequence[int] | np.ndarray) -> ParseResult:
        """Sampled tokens read back as the assistant's message and how they ended."""
        with as_renderer_error():
            parsed = self._core.parse_response(response)
        return ParseResult(cookbook_message(parsed), ParseTermination(parsed.termination))

    def build_supervised_example(
        self,
        messages: list[Message],
        train_on_what: TrainOnWhat | str = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
    ) -> tuple[tinker.ModelInput, np.ndarray]:
        """Tokens of `messages` and float32 `[T]` weights (`rlpure.render._chat` layout)."""
        mode = parse_train_on_what(train_on_what)
        _check_mapping(messages)
        flags = trainable_flags(messages, mode)
        with as_renderer_error():
            example = self._core.build_supervised_example(
                core_messages(messages), train_on=mode.value, trainable_M=flags
            )
        return tinker.ModelInput.from_ints(example.model_input.to_ints()), example.weights_T

    def create_conversation_prefix_with_tools(
        self, tools: list[ToolSpec], system_prompt: str = ""
    ) -> list[Message]:
        """A system message declaring `tools` (Hermes/Qwen wording), after `system_prompt`.

        Raises:
            NotImplementedError: for a format without tool calls.
        """
        if not self.supports_tools:
            raise NotImplementedError(f"{type(self).__name__} does not support tool calling")
        return [{"role": "system", "content": render.tools_system_prompt(tools, system_prompt)}]
