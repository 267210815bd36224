"""tinker-cookbook 0.6.1's renderer types (`tinker_cookbook.renderers.base`), over `rlpure.render`.

Conventions:
- A `Message` is the cookbook's `TypedDict`: `role`, `content` (a string, or a list of content
  parts: `TextPart`, `ImagePart`, `AudioPart`, `ThinkingPart`) and the optional `tool_calls`,
  `unparsed_tool_calls`, `trainable`, `tool_call_id`, `name`. Text-only renderers read
  `content` through `ensure_text` and refuse multimodal content with a `RendererError`.
- A `Renderer` speaks the cookbook's API at this edge: `build_generation_prompt` returns a
  `tinker.ModelInput`; `parse_response(tokens)` returns a `ParseResult(message, termination)`
  — a `NamedTuple`, so `message, termination = renderer.parse_response(tokens)` and
  `renderer.parse_response(tokens)[0]` work as with the cookbook's tuple;
  `build_supervised_example` returns `(tinker.ModelInput, weights)`; `get_stop_sequences`
  returns a list. The token maths lives in `rlpure.render`; renderers here convert types only.
- Differences from the cookbook, all deliberate: prompts are one `EncodedTextChunk` (the
  cookbook's have one chunk per piece; `to_ints()` is identical); supervised weights are a
  read-only float32 numpy array `[T]` (the cookbook's a `torch.Tensor`, int64 or float32
  depending on the mode), so the project needs no torch.
- Renderers pickle as the cookbook's do, by name: the renderer name and the tokenizer's model
  name travel, and unpickling rebuilds the tokenizer with `shell.tokenizers.get_tokenizer`
  (local model names and registered tokenizers resolve offline).
- `get_renderer` and the custom-renderer registry live here (not in the package facade, as in
  the cookbook) so that pickling, which rebuilds a renderer by name, needs no import of the
  facade; concrete renderer modules register their factory with `_register_builtin_renderer`
  when the facade imports them.
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Any, Literal, NamedTuple, NotRequired, TypeAlias, TypedDict

import msgspec
import numpy as np
import tinker

from shell import tokenizers
from shell.errors import RendererError

__all__ = [
    "COOKBOOK_RENDERER_NAMES",
    "PARSE_FAILURE_DETAIL_MAX_CHARS",
    "AudioPart",
    "Content",
    "ContentPart",
    "ImagePart",
    "Message",
    "ParseFailureKind",
    "ParseResult",
    "ParseTermination",
    "Renderer",
    "Role",
    "TextPart",
    "ThinkingPart",
    "ToolCall",
    "ToolSpec",
    "TrainOnWhat",
    "UnparsedToolCall",
    "classify_parse_failure",
    "content_to_jsonable",
    "ensure_list",
    "ensure_text",
    "format_content_as_string",
    "get_registered_renderer_names",
    "get_renderer",
    "get_text_content",
    "is_renderer_registered",
    "message_to_jsonable",
    "register_renderer",
    "unregister_renderer",
]


# --- messages --------------------------------------------------------------------------------


class TextPart(TypedDict):
    """Visible text content of a message."""

    type: Literal["text"]
    text: str


class ImagePart(TypedDict):
    """An image: a URL or data-URI string, or a `PIL.Image.Image`."""

    type: Literal["image"]
    image: Any


class AudioPart(TypedDict):
    """Input audio: encoded bytes, a base64 `data:` URI, or a local path."""

    type: Literal["audio"]
    audio: str | bytes
    format: NotRequired[Literal["wav", "mp3", "flac"]]
    num_frames: NotRequired[int]
    sample_rate: NotRequired[int]


class ThinkingPart(TypedDict):
    """The model's reasoning (chain of thought)."""

    type: Literal["thinking"]
    thinking: str


ContentPart: TypeAlias = TextPart | ImagePart | AudioPart | ThinkingPart
"""One part of a multimodal message content."""

Role: TypeAlias = str
"""A message role: usually `"system"`, `"user"`, `"assistant"` or `"tool"`."""

Content: TypeAlias = str | list[ContentPart]
"""Message content: a string or a list of content parts."""


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """A parsed tool invocation (OpenAI function-calling format).

    Attributes:
        function: the tool's name and its JSON-encoded arguments.
        type: always `"function"`.
        id: optional identifier correlating the call with its result message.
    """

    class FunctionBody(msgspec.Struct, frozen=True, kw_only=True):
        """The called function: `name` and `arguments` (a JSON string)."""

        name: str
        arguments: str

    function: FunctionBody
    type: Literal["function"] = "function"
    id: str | None = None


class UnparsedToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """Model output that looked like a tool call but did not parse.

    Attributes:
        raw_text: the model's text.
        error: what went wrong.
    """

    raw_text: str
    error: str


class Message(TypedDict):
    """One turn of a conversation (the cookbook's `Message`)."""

    role: Role
    content: Content
    tool_calls: NotRequired[list[ToolCall]]
    unparsed_tool_calls: NotRequired[list[UnparsedToolCall]]
    trainable: NotRequired[bool]
    tool_call_id: NotRequired[str]
    name: NotRequired[str]


class ToolSpec(TypedDict):
    """A tool the model may call: `name`, `description` and a JSON-schema `parameters`."""

    name: str
    description: str
    parameters: dict[str, Any]


def ensure_text(content: Content) -> str:
    """The text of text-only content (a string, or a list holding one `TextPart`).

    Raises:
        RendererError: for multimodal content or several parts.

    Examples:
        >>> ensure_text([{"type": "text", "text": "hi"}])
        'hi'
    """
    if isinstance(content, str):
        return content
    if len(content) == 1 and content[0]["type"] == "text":
        return content[0]["text"]
    raise RendererError(
        f"ensure_text: expected text content, got multimodal content with {len(content)} parts"
    )


def ensure_list(content: Content) -> list[ContentPart]:
    """Content as a list of parts (a string becomes one `TextPart`)."""
    if isinstance(content, str):
        return [TextPart(type="text", text=content)]
    return content


def get_text_content(message: Message) -> str:
    """The message's text parts joined, thinking and other parts dropped (strings as they are).

    Examples:
        >>> get_text_content({"role": "assistant", "content": "4"})
        '4'
    """
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(part["text"] for part in content if part["type"] == "text")


def format_content_as_string(content: Content, separator: str = "\n") -> str:
    """Every part of `content` as readable text, joined with `separator`.

    Thinking becomes `<think>...</think>`, images `<image>url</image>` or
    `<image>Image(WxH, mode)</image>`, audio `<audio>...</audio>`.

    Raises:
        RendererError: for an unknown part type.
    """
    if isinstance(content, str):
        return content
    pieces: list[str] = []
    for part in content:
        kind = part["type"]
        if kind == "text":
            pieces.append(part["text"])  # type: ignore[typeddict-item]
        elif kind == "thinking":
            pieces.append(f"<think>{part['thinking']}</think>")  # type: ignore[typeddict-item]
        elif kind == "image":
            image = part["image"]  # type: ignore[typeddict-item]
            if isinstance(image, str):
                pieces.append(f"<image>{image}</image>")
            else:
                pieces.append(
                    f"<image>Image({image.size[0]}x{image.size[1]}, {image.mode})</image>"
                )
        elif kind == "audio":
            audio = part["audio"]  # type: ignore[typeddict-item]
            shown = audio if isinstance(audio, str) else f"{len(audio)} bytes"
            pieces.append(f"<audio>{shown}</audio>")
        else:
            raise RendererError(f"format_content_as_string: unknown content part type {kind!r}")
    return separator.join(pieces)


def content_to_jsonable(content: Content) -> str | list[dict[str, Any]]:
    """Content as JSON-ready data: a string as it is, parts as plain dicts.

    An image part keeps its URL string; a `PIL.Image` is left out (the part keeps only its type).

    Raises:
        RendererError: for a part type other than text, thinking and image.

    Examples:
        >>> content_to_jsonable([{"type": "thinking", "thinking": "hm"}])
        [{'type': 'thinking', 'thinking': 'hm'}]
    """
    if isinstance(content, str):
        return content
    out: list[dict[str, Any]] = []
    for part in content:
        kind = part["type"]
        if kind == "text":
            out.append({"type": "text", "text": part["text"]})  # type: ignore[typeddict-item]
        elif kind == "thinking":
            out.append({"type": "thinking", "thinking": part["thinking"]})  # type: ignore[typeddict-item]
        elif kind == "image":
            image = part["image"]  # type: ignore[typeddict-item]
            out.append(
                {"type": "image", "image": image} if isinstance(image, str) else {"type": "image"}
            )
        else:
            raise RendererError(f"content_to_jsonable: unknown content part type {kind!r}")
    return out


def message_to_jsonable(message: Message) -> dict[str, Any]:
    """A message as JSON-ready data, keeping its optional fields (the cookbook's shape).

    Tool calls become `{"type", "id", "function": {"name", "arguments"}}`, unparsed ones
    `{"raw_text", "error"}`; `trainable`, `tool_call_id` and `name` are kept when present.
    """
    result: dict[str, Any] = {
        "role": message["role"],
        "content": content_to_jsonable(message["content"]),
    }
    if "tool_calls" in message:
        result["tool_calls"] = [
            {
                "type": call.type,
                "id": call.id,
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
            for call in message["tool_calls"]
        ]
    if "unparsed_tool_calls" in message:
        result["unparsed_tool_calls"] = [
            {"raw_text": call.raw_text, "error": call.error}
            for call in message["unparsed_tool_calls"]
        ]
    for key in ("trainable", "tool_call_id", "name"):
        if key in message:
            result[key] = message[key]
    return result


# --- parse results -----------------------------------------------------------------------------


class ParseTermination(StrEnum):
    """How a sampled response ended (the cookbook's `ParseTermination`).

    `STOP_SEQUENCE`: the renderer's stop signal fired; `EOS`: the model ended with EOS without
    it; `MALFORMED`: neither, or several stop signals. The values equal `rlpure.render`'s
    `Termination` strings.
    """

    STOP_SEQUENCE = "stop_sequence"
    EOS = "eos"
    MALFORMED = "malformed"

    @property
    def is_clean(self) -> bool:
        """True for `STOP_SEQUENCE` and `EOS`: what lenient grading gates on."""
        return self is not ParseTermination.MALFORMED

    @property
    def is_stop_sequence(self) -> bool:
        """True only for `STOP_SEQUENCE`: the strict format gate."""
        return self is ParseTermination.STOP_SEQUENCE


class ParseResult(NamedTuple):
    """What `Renderer.parse_response` returns: a best-effort message and how it ended."""

    message: Message
    termination: ParseTermination


class ParseFailureKind(StrEnum):
    """Which parse failure a response shows: broken framing or unparsable content."""

    STRUCTURAL = "structural"
    CONTENT = "content"


PARSE_FAILURE_DETAIL_MAX_CHARS = 16384
"""Cap on the detail string of `classify_parse_failure`."""


def classify_parse_failure(
    message: Message, termination: ParseTermination
) -> tuple[ParseFailureKind, str] | None:
    """The parse failure of a `parse_response` result, or None when it parsed cleanly.

    A response that did not terminate cleanly is `STRUCTURAL` (this wins); a clean one with
    `unparsed_tool_calls` is `CONTENT`, with their errors joined as the detail.
    """
    if not ParseTermination(termination).is_clean:
        return (
            ParseFailureKind.STRUCTURAL,
            f"response did not terminate cleanly (termination={ParseTermination(termination)}): "
            "expected the renderer's stop signal or EOS, so the message framing is broken",
        )
    unparsed = message.get("unparsed_tool_calls") or []
    if unparsed:
        detail = "\n".join(call.error for call in unparsed)
        return ParseFailureKind.CONTENT, detail[:PARSE_FAILURE_DETAIL_MAX_CHARS]
    return None


class TrainOnWhat(StrEnum):
    """Which tokens a supervised example trains on (the cookbook's `TrainOnWhat`)."""

    LAST_ASSISTANT_MESSAGE = "last_assistant_message"
    LAST_ASSISTANT_TURN = "last_assistant_turn"
    ALL_ASSISTANT_MESSAGES = "all_assistant_messages"
    ALL_MESSAGES = "all_messages"
    ALL_TOKENS = "all_tokens"
    ALL_USER_AND_SYSTEM_MESSAGES = "all_user_and_system_messages"
    CUSTOMIZED = "customized"


# --- the renderer base class -------------------------------------------------------------------


class Renderer(ABC):
    """Messages ↔ tokens for one chat format (the cookbook's `Renderer` API).

    Subclasses implement `get_stop_sequences`, `build_generation_prompt`, `parse_response` and
    `build_supervised_example`. (The cookbook's base also assembles prompts from a per-message
    `render_message`; that default is not offered here: subclass
    `tinker_cookbook.renderers.Renderer` for such a renderer — the shell accepts its output.)

    Pickling: a renderer made by `get_renderer` pickles by name (see the module docstring).

    Attributes:
        tokenizer: the tokenizer the renderer encodes and decodes with.
    """

    tokenizer: Any
    disables_thinking: bool = False
    supports_streaming: bool = False
    _renderer_name: str | None = None
    _model_name: str | None = None
    _has_image_processor: bool = False

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __reduce__(self) -> tuple[Any, ...]:
        if self._renderer_name is None or self._model_name is None:
            raise pickle.PicklingError(
                f"Cannot pickle {type(self).__name__}: _renderer_name or _model_name is not set; "
                "make renderers with shell.chat.get_renderer() to pickle them"
            )
        return (
            _unpickle_renderer,
            (self._renderer_name, self._model_name, self._has_image_processor),
        )

    @property
    def has_extension_property(self) -> bool:
        """Whether each turn's prompt extends the previous turn's full sequence."""
        return False

    @abstractmethod
    def get_stop_sequences(self) -> list[str] | list[int]:
        """Stop strings or stop token ids that end a sampled message."""

    @abstractmethod
    def build_generation_prompt(
        self, messages: list[Message], role: Role = "assistant", prefill: str | None = None
    ) -> tinker.ModelInput:
        """The prompt asking the model for the next `role` message, optionally prefilled."""

    @abstractmethod
    def parse_response(self, response: Sequence[int] | np.ndarray) -> ParseResult:
        """Sampled tokens read back as a message and how they ended."""

    @abstractmethod
    def build_supervised_example(
        self,
        messages: list[Message],
        train_on_what: TrainOnWhat | str = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
    ) -> tuple[tinker.ModelInput, np.ndarray]:
        """Tokens of `messages` and float32 `[T]` weights selected by `train_on_what`."""

    def build_supervised_examples(
        self,
        messages: list[Message],
        train_on_what: TrainOnWhat | str = TrainOnWhat.LAST_ASSISTANT_TURN,
    ) -> list[tuple[tinker.ModelInput, np.ndarray]]:
        """Supervised examples for `messages`: one when the renderer has the extension property,
        otherwise one per trained assistant message, each ending at it.

        Raises:
            NotImplementedError: when the mode weighs non-assistant messages and the renderer
                lacks the extension property (there is no prompt to end each example at).
        """
        if self.has_extension_property:
            return [self.build_supervised_example(messages, train_on_what=train_on_what)]
        mode = TrainOnWhat(train_on_what)
        if mode is TrainOnWhat.LAST_ASSISTANT_MESSAGE:
            start = len(messages) - 1
        elif mode is TrainOnWhat.LAST_ASSISTANT_TURN:
            start = 1 + max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
        elif mode is TrainOnWhat.ALL_ASSISTANT_MESSAGES:
            start = 0
        else:
            raise NotImplementedError(
                f"build_supervised_examples cannot split {mode} for a renderer without the "
                "extension property"
            )
        return [
            self.build_supervised_example(
                messages[: i + 1], train_on_what=TrainOnWhat.LAST_ASSISTANT_MESSAGE
            )
            for i in range(max(start, 0), len(messages))
            if messages[i]["role"] == "assistant"
        ]

    def create_conversation_prefix_with_tools(
        self, tools: list[ToolSpec], system_prompt: str = ""
    ) -> list[Message]:
        """Messages declaring `tools`, to put before a conversation.

        Raises:
            NotImplementedError: when the format has no tool-calling convention.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support tool calling")

    def to_openai_message(self, message: Message) -> dict[str, Any]:
        """The message in OpenAI chat-completions form (text and thinking content only)."""
        result: dict[str, Any] = {"role": message["role"]}
        content = message["content"]
        if isinstance(content, str):
            result["content"] = content
        else:
            pieces = []
            for part in content:
                if part["type"] == "text":
                    pieces.append(part["text"])
                elif part["type"] == "thinking":
                    pieces.append(f"<think>{part['thinking']}</think>")
                else:
                    raise NotImplementedError(
                        f"to_openai_message: {part['type']} content is not supported"
                    )
            result["content"] = "".join(pieces)
        if "tool_calls" in message:
            result["tool_calls"] = [
                {
                    "type": call.type,
                    "id": call.id,
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
                for call in message["tool_calls"]
            ]
        for key in ("tool_call_id", "name"):
            if key in message:
                result[key] = message[key]
        return result


# --- the registry ------------------------------------------------------------------------------

RendererFactory: TypeAlias = Callable[[Any, Any], Renderer]
"""`(tokenizer, image_processor) -> Renderer`, as `register_renderer` takes it."""

_BUILTIN_RENDERERS: dict[str, RendererFactory] = {}
_CUSTOM_RENDERERS: dict[str, RendererFactory] = {}

COOKBOOK_RENDERER_NAMES: tuple[str, ...] = (
    "role_colon",
    "llama3",
    "qwen3",
    "qwen3_vl",
    "qwen3_vl_instruct",
    "qwen3_disable_thinking",
    "qwen3_instruct",
    "qwen3_5",
    "qwen3_5_disable_thinking",
    "qwen3_5_preserve_thinking",
    "qwen3_8_xhigh_reasoning",
    "qwen3_8_medium_reasoning",
    "qwen3_8_low_reasoning",
    "qwen3_8_disable_thinking",
    "deepseekv3",
    "deepseekv3_disable_thinking",
    "deepseekv3_thinking",
    "deepseekv4_1",
    "deepseekv4_1_low_reasoning",
    "deepseekv4_1_max_reasoning",
    "deepseekv4_1_disable_thinking",
    "deepseekv4_1_preserve_thinking",
    "glm5_3_max_reasoning",
    "glm5_3_low_reasoning",
    "glm5_3_high_reasoning",
    "kimi_k2",
    "kimi_k25",
    "kimi_k25_disable_thinking",
    "kimi_k26",
    "kimi_k26_disable_thinking",
    "kimi_k26_preserve_thinking",
    "kimi_k31_pro_max_reasoning",
    "kimi_k31_pro_high_reasoning",
    "kimi_k31_pro_low_reasoning",
    "kimi_k31_pro_disable_thinking",
    "kimi_k31_pro_no_reasoning_effort",
    "nemotron3",
    "nemotron3_low_thinking",
    "nemotron3_disable_thinking",
    "nemotron3_preserve_thinking",
    "nemotron3_ultra",
    "nemotron3_ultra_disable_thinking",
    "nemotron3_ultra_medium_thinking",
    "nemotron3_ultra_preserve_thinking",
    "gpt_oss_no_sysprompt",
    "gpt_oss_low_reasoning",
    "gpt_oss_medium_reasoning",
    "gpt_oss_high_reasoning",
    "tml_v0",
)
"""Every renderer name tinker-cookbook 0.6.1's `get_renderer` knows."""


def _register_builtin_renderer(name: str, factory: RendererFactory) -> None:
    """Adds one of the shell's own renderers (called by its module on import)."""
    _BUILTIN_RENDERERS[name] = factory


def register_renderer(name: str, factory: RendererFactory) -> None:
    """Makes `get_renderer(name, ...)` call `factory(tokenizer, image_processor)`.

    Custom names take precedence over the built-in ones, as in the cookbook; use a namespaced
    name (`"Org/my_renderer"`) to avoid collisions.
    """
    _CUSTOM_RENDERERS[name] = factory


def unregister_renderer(name: str) -> bool:
    """Removes a custom renderer; False when `name` was not registered."""
    return _CUSTOM_RENDERERS.pop(name, None) is not None


def get_registered_renderer_names() -> list[str]:
    """The names registered with `register_renderer` (built-in names not included)."""
    return list(_CUSTOM_RENDERERS)


def is_renderer_registered(name: str) -> bool:
    """Whether `name` was registered with `register_renderer`."""
    return name in _CUSTOM_RENDERERS


def get_renderer(
    name: str,
    tokenizer: Any,
    image_processor: Any | None = None,
    model_name: str | None = None,
) -> Renderer:
    """The renderer called `name` over `tokenizer` (the cookbook's `get_renderer`).

    Args:
        name: `"role_colon"`, or a name registered with `register_renderer`.
        tokenizer: a Hugging Face tokenizer, the local `ByteTokenizer`, or any object with
            `encode`, `decode`, `bos_token_id`, `eos_token_id`.
        image_processor: passed to custom factories; unused by `role_colon`.
        model_name: the model name pickling rebuilds the tokenizer from (default:
            `tokenizer.name_or_path`).

    Raises:
        RendererError: for a name the shell does not offer (yet), listing those it does; for a
            chat renderer of the cookbook, saying how to use the cookbook's meanwhile.

    Examples:
        >>> from rlpure.model import ByteTokenizer
        >>> renderer = get_renderer("role_colon", ByteTokenizer())
        >>> renderer.get_stop_sequences()
        ['\\n\\nUser:']
    """
    factory = _CUSTOM_RENDERERS.get(name) or _BUILTIN_RENDERERS.get(name)
    if factory is None:
        supported = sorted(_BUILTIN_RENDERERS) + sorted(_CUSTOM_RENDERERS)
        if name in COOKBOOK_RENDERER_NAMES:
            raise RendererError(
                f"get_renderer: renderer {name!r} is not in rlpure yet (supported: "
                f"{', '.join(supported)}); meanwhile use the cookbook's own, "
                f"`tinker_cookbook.renderers.get_renderer({name!r}, tokenizer)`, whose output "
                "the shell accepts, or register one with shell.chat.register_renderer()"
            )
        raise RendererError(
            f"get_renderer: unknown renderer {name!r} (supported: {', '.join(supported)}); "
            "register a custom one with shell.chat.register_renderer()"
        )
    renderer = factory(tokenizer, image_processor)
    renderer._renderer_name = name
    renderer._model_name = (
        model_name if model_name is not None else getattr(tokenizer, "name_or_path", None)
    )
    renderer._has_image_processor = image_processor is not None
    return renderer


def _unpickle_renderer(renderer_name: str, model_name: str, has_image_processor: bool) -> Renderer:
    """Rebuilds a pickled renderer from its name and its tokenizer's model name."""
    if has_image_processor:
        raise pickle.UnpicklingError(
            f"Cannot unpickle renderer {renderer_name!r}: it was made with an image processor, "
            "which the shell cannot rebuild by name"
        )
    tokenizer = tokenizers.get_tokenizer(model_name)
    return get_renderer(renderer_name, tokenizer, model_name=model_name)


def _check_mapping(messages: Sequence[Mapping[str, Any]]) -> None:
    """Refuses anything but a list/tuple of mappings (before reading `role`/`content`)."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise TypeError(
            f"messages: expected a list of message dicts, got {type(messages).__name__}"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TypeError(f"messages[{i}]: expected a dict, got {type(message).__name__}")
        for key in ("role", "content"):
            if key not in message:
                raise ValueError(f"messages[{i}]: missing key {key!r}")
