"""Records and checks shared by every renderer: messages, parsed responses, supervised examples.

Conventions:
- A message is a mapping with `role` (str) and `content`: a string, or a sequence of content
  parts (`TextPart` `{"type": "text", "text": ...}`, `ThinkingPart`
  `{"type": "thinking", "thinking": ...}`). Chat renderers also read `tool_calls` (a sequence
  of `ToolCall`) on assistant messages; `tool_call_id` and `name` may ride along on tool
  results and are not rendered by the formats here. `role_colon` takes string content only.
- Supervised weights are float32 `[T]`, 0.0 or 1.0 per token (`SupervisedExample`).
- Errors name the message index and field: `messages[2]['content']: expected str or a list of
  content parts, got int`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NotRequired, Protocol, TypedDict, runtime_checkable

import msgspec
import numpy as np
from msgspec.structs import force_setattr

from rlpure.records import ModelInput

__all__ = [
    "ChatMessage",
    "ContentPart",
    "Message",
    "ParsedResponse",
    "Renderer",
    "SupervisedExample",
    "Termination",
    "TextPart",
    "ThinkingPart",
    "TokenizerLike",
    "ToolCall",
    "TrainOn",
    "UnparsedToolCall",
]

Termination = Literal["stop_sequence", "eos", "malformed"]
"""How a sampled response ended (see each renderer's `parse_response`)."""

TrainOn = Literal[
    "last_assistant_message",
    "last_assistant_turn",
    "all_assistant_messages",
    "all_messages",
    "all_tokens",
    "all_user_and_system_messages",
    "customized",
]
"""Which tokens a supervised example trains on (the cookbook's `TrainOnWhat` values)."""

TRAIN_ON: tuple[str, ...] = (
    "last_assistant_message",
    "last_assistant_turn",
    "all_assistant_messages",
    "all_messages",
    "all_tokens",
    "all_user_and_system_messages",
    "customized",
)

_TERMINATIONS: tuple[str, ...] = ("stop_sequence", "eos", "malformed")


class Message(TypedDict):
    """One chat message with text content (what `role_colon` renders)."""

    role: str
    content: str


class TextPart(TypedDict):
    """Visible text of a message."""

    type: Literal["text"]
    text: str


class ThinkingPart(TypedDict):
    """The model's reasoning (chain of thought)."""

    type: Literal["thinking"]
    thinking: str


ContentPart = TextPart | ThinkingPart
"""One part of structured message content."""


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """A tool invocation the model wrote (OpenAI function-calling shape, flattened).

    Attributes:
        name: the tool's name.
        arguments: the arguments as a JSON object string.
        id: optional identifier correlating the call with its result.
    """

    name: str
    arguments: str
    id: str | None = None


class UnparsedToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """Model output that looked like a tool call but did not parse.

    Attributes:
        raw_text: the model's text of the block (tags included).
        error: what went wrong (the cookbook's wording).
    """

    raw_text: str
    error: str


class ChatMessage(TypedDict):
    """One chat message as chat renderers read it (the cookbook `Message` subset they render)."""

    role: str
    content: str | Sequence[ContentPart]
    tool_calls: NotRequired[Sequence[ToolCall]]
    tool_call_id: NotRequired[str]
    name: NotRequired[str]


@runtime_checkable
class TokenizerLike(Protocol):
    """The tokenizer surface a renderer uses (a subset of Hugging Face's)."""

    @property
    def bos_token_id(self) -> int | None: ...

    @property
    def eos_token_id(self) -> int | None: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ParsedResponse(msgspec.Struct, frozen=True, kw_only=True, repr_omit_defaults=True):
    """A sampled response read back as an assistant message.

    Attributes:
        content: the assistant's visible text (thinking and tool-call blocks removed; for
            `role_colon`, without the rendered leading space, the stop sequence or EOS). Best
            effort when `termination` is `"malformed"`.
        termination: how the response ended.
        role: always `"assistant"`.
        parts: the content as parts in order (`ThinkingPart`, `TextPart`) when the response
            held `<think>` or tool-call blocks; None when it is plain text (`content`).
        tool_calls: the tool calls that parsed, in order.
        unparsed_tool_calls: tool-call blocks that did not parse (bad JSON, missing fields,
            an unterminated block): a content failure, recoverable in the episode.
    """

    content: str
    termination: Termination
    role: str = "assistant"
    parts: tuple[ContentPart, ...] | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    unparsed_tool_calls: tuple[UnparsedToolCall, ...] = ()

    def __post_init__(self) -> None:
        if self.termination not in _TERMINATIONS:
            raise ValueError(
                f"ParsedResponse.termination: expected one of {_TERMINATIONS}, "
                f"got {self.termination!r}"
            )

    @property
    def is_clean(self) -> bool:
        """True for `"stop_sequence"` and `"eos"`: what lenient grading gates on."""
        return self.termination != "malformed"

    @property
    def is_stop_sequence(self) -> bool:
        """True only for `"stop_sequence"`: the strict format gate of `ProblemEnv`."""
        return self.termination == "stop_sequence"

    @property
    def message(self) -> Message:
        """The response as a text chat message (thinking and tool calls left out)."""
        return {"role": self.role, "content": self.content}


class SupervisedExample(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """Tokens of a whole conversation with a per-token training weight.

    Attributes:
        model_input: the tokens, int32 `[T]`.
        weights_T: float32 `[T]`, read-only; 1.0 on tokens the model is trained to produce,
            0.0 elsewhere.
    """

    model_input: ModelInput
    weights_T: np.ndarray

    def __post_init__(self) -> None:
        if not isinstance(self.model_input, ModelInput):
            raise TypeError(
                "SupervisedExample.model_input: expected ModelInput, "
                f"got {type(self.model_input).__name__}"
            )
        weights = np.array(self.weights_T, dtype=np.float32, copy=True)
        if weights.shape != (self.model_input.length,):
            raise ValueError(
                f"SupervisedExample.weights_T: shape {weights.shape} != tokens shape "
                f"({self.model_input.length},)"
            )
        weights.flags.writeable = False
        force_setattr(self, "weights_T", weights)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, SupervisedExample)
            and self.model_input == other.model_input
            and np.array_equal(self.weights_T, other.weights_T)
        )

    __hash__ = None  # type: ignore[assignment]


class Renderer(Protocol):
    """What the shell needs from a renderer (the cookbook's `Renderer`, text and tool subset)."""

    @property
    def has_extension_property(self) -> bool:
        """Whether each turn's prompt extends the previous turn's prompt plus its response."""
        ...

    def build_generation_prompt(
        self, messages: Sequence[Mapping[str, Any]], *, role: str = "assistant"
    ) -> ModelInput:
        """The prompt that asks the model to write the next `role` message."""
        ...

    def get_stop_sequences(self) -> tuple[str, ...] | tuple[int, ...]:
        """Strings, or token ids, that end a sampled message."""
        ...

    def parse_response(self, tokens: Sequence[int] | np.ndarray) -> ParsedResponse:
        """Reads sampled tokens back as a message with its termination."""
        ...

    def build_supervised_example(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        train_on: TrainOn = ...,
        trainable_M: Sequence[bool] | None = ...,
    ) -> SupervisedExample:
        """Tokens and weights for supervised training on `messages`."""
        ...


# --- checks ------------------------------------------------------------------------------------


def check_message_list(messages: object) -> None:
    """Refuses anything but a sequence of mappings, each with a non-empty string `role`."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise TypeError(
            f"messages: expected a sequence of message mappings, got {type(messages).__name__}"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TypeError(f"messages[{i}]: expected a mapping, got {type(message).__name__}")
        for key in ("role", "content"):
            if key not in message:
                raise ValueError(f"messages[{i}]: missing key {key!r}")
        if not isinstance(message["role"], str):
            raise TypeError(
                f"messages[{i}]['role']: expected str, got {type(message['role']).__name__}"
            )
        if not message["role"]:
            raise ValueError(f"messages[{i}]['role']: empty role")


def check_text_messages(messages: object) -> None:
    """`check_message_list`, and every `content` a string."""
    check_message_list(messages)
    assert isinstance(messages, Sequence)
    for i, message in enumerate(messages):
        if not isinstance(message["content"], str):
            raise TypeError(
                f"messages[{i}]['content']: expected str, got {type(message['content']).__name__}"
            )


def check_chat_messages(
    messages: object, *, roles: tuple[str, ...], thinking: bool, tool_calls: bool
) -> None:
    """Checks messages for a chat renderer: known roles, text or part content, tool calls.

    Args:
        messages: the conversation.
        roles: the roles the format knows.
        thinking: whether `ThinkingPart`s are accepted.
        tool_calls: whether assistant `tool_calls` are accepted.

    Raises:
        TypeError, ValueError: naming the message index and field.
    """
    check_message_list(messages)
    assert isinstance(messages, Sequence)
    for i, message in enumerate(messages):
        role = message["role"]
        if role not in roles:
            raise ValueError(f"messages[{i}]['role']: unknown role {role!r}; known: {roles}")
        content = message["content"]
        if not isinstance(content, str):
            if isinstance(content, (bytes, Mapping)) or not isinstance(content, Sequence):
                raise TypeError(
                    f"messages[{i}]['content']: expected str or a list of content parts, "
                    f"got {type(content).__name__}"
                )
            for j, part in enumerate(content):
                _check_part(part, where=f"messages[{i}]['content'][{j}]", thinking=thinking)
        if "tool_calls" in message:
            if not tool_calls:
                raise ValueError(
                    f"messages[{i}]['tool_calls']: this format has no tool-call syntax"
                )
            if role != "assistant":
                raise ValueError(
                    f"messages[{i}]['tool_calls']: only assistant messages call tools "
                    f"(role {role!r})"
                )
            calls = message["tool_calls"]
            if isinstance(calls, (str, bytes, Mapping)) or not isinstance(calls, Sequence):
                raise TypeError(
                    f"messages[{i}]['tool_calls']: expected a list of ToolCall, "
                    f"got {type(calls).__name__}"
                )
            for j, call in enumerate(calls):
                check_tool_call(call, where=f"messages[{i}]['tool_calls'][{j}]")


def _check_part(part: object, *, where: str, thinking: bool) -> None:
    if not isinstance(part, Mapping):
        raise TypeError(f"{where}: expected a content part mapping, got {type(part).__name__}")
    kind = part.get("type")
    if kind == "text":
        field = "text"
    elif kind == "thinking" and thinking:
        field = "thinking"
    else:
        known = ("text", "thinking") if thinking else ("text",)
        raise ValueError(f"{where}['type']: unsupported content part type {kind!r}; known: {known}")
    if not isinstance(part.get(field), str):
        raise TypeError(f"{where}[{field!r}]: expected str, got {type(part.get(field)).__name__}")


def check_tool_call(call: object, *, where: str) -> None:
    """Refuses a tool call whose name is not a string or whose arguments are not a JSON object."""
    if not isinstance(call, ToolCall):
        raise TypeError(f"{where}: expected rlpure.render.ToolCall, got {type(call).__name__}")
    if not call.name:
        raise ValueError(f"{where}.name: empty tool name")
    try:
        arguments = json.loads(call.arguments)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}.arguments: not valid JSON ({error})") from None
    if not isinstance(arguments, dict):
        raise ValueError(
            f"{where}.arguments: expected a JSON object, got {type(arguments).__name__}"
        )


def check_train_on(train_on: str, trainable_M: Sequence[bool] | None, n_messages: int) -> None:
    """Refuses an unknown `train_on`, or `trainable_M` missing/extra/of the wrong length."""
    if train_on not in TRAIN_ON:
        raise ValueError(
            f"build_supervised_example: unknown train_on {train_on!r}; known: {TRAIN_ON}"
        )
    if (train_on == "customized") != (trainable_M is not None):
        raise ValueError(
            "build_supervised_example: trainable_M is required with train_on='customized' "
            f"and refused otherwise (train_on={train_on!r})"
        )
    if trainable_M is not None and len(trainable_M) != n_messages:
        raise ValueError(
            f"build_supervised_example: trainable_M has {len(trainable_M)} flags for "
            f"{n_messages} messages"
        )


def output_is_trained(
    train_on: str, *, role: str, is_last: bool, in_last_turn: bool, trainable: bool
) -> bool:
    """Whether a message's output carries weight under `train_on` (the cookbook's rule).

    `"last_assistant_message"`: the last message, if it is the assistant's;
    `"last_assistant_turn"`: assistant messages after the last user message of
    `messages[:-1]`; `"all_assistant_messages"`: every assistant message; `"all_messages"` and
    `"all_tokens"`: every message; `"all_user_and_system_messages"`: user and system messages;
    `"customized"`: message `m` when `trainable_M[m]`.
    """
    if train_on == "last_assistant_message":
        return is_last and role == "assistant"
    if train_on == "last_assistant_turn":
        return in_last_turn and role == "assistant"
    if train_on == "all_assistant_messages":
        return role == "assistant"
    if train_on in ("all_messages", "all_tokens"):
        return True
    if train_on == "all_user_and_system_messages":
        return role in ("user", "system")
    return trainable  # "customized"


def text_of_parts(parts: Sequence[ContentPart]) -> str:
    """The text parts joined (thinking left out)."""
    return "".join(part["text"] for part in parts if part["type"] == "text")
