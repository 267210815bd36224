"""The Qwen3 chat format (`<|im_start|>role\\n...<|im_end|>`, `<think>` reasoning) as pure functions.

Conventions (tinker-cookbook 0.6.1's `Qwen3Renderer`, which follows Qwen3's Hugging Face chat
template with `enable_thinking=True`):
- Header `"\\n<|im_start|>{role}\\n"` (no leading newline on the first message); a `tool`
  message renders as role `user` with its content inside `<tool_response>\\n...\\n</tool_response>`.
  Output: the content (via `encode_content`) and the `<|im_end|>` token. No BOS. The stop
  sequence is the `<|im_end|>` token id.
- Thinking: a `ThinkingPart` renders `<think>{t}</think>`; on the *produced turn* (an
  assistant message that is the last of the list, in a conversation with a user message) it is
  framed as the template frames it, `<think>\\n{t stripped of newlines}\\n</think>\\n\\n`, and a
  produced turn without reasoning gets the empty block `<think>\\n\\n</think>\\n\\n`. Text right
  after a framed block loses its leading newlines. String content holding `</think>` on a
  produced turn is normalized the same way.
- History: with `strip_thinking_from_history=True` (the default, the template's behaviour)
  thinking parts of earlier assistant messages are dropped and they are not framed. **The
  prefix property breaks there**: the turn the model wrote (`<think>...</think>\\n\\nanswer`)
  renders as `answer` in the next prompt, so a two-turn episode is two datums
  (`has_extension_property` is False). With `strip_thinking_from_history=False` every
  assistant message is framed alike and keeps its thinking, and each prompt extends the last.
- Tool calls on an assistant message follow its text: `"\\n"` (only when there is text), then
  the `<tool_call>` blocks joined by `"\\n"` (`rlpure.render._tools`).
- `Qwen3DisableThinkingRenderer` (`enable_thinking=False`): the generation prompt ends with
  the empty block `<think>\\n\\n</think>\\n\\n`, so sampling starts after it and supervised
  examples do not train it; a trained turn that reasons is refused, and so is a produced turn in
  a conversation with no user message (the template and the prompt disagree there).
- `Qwen3InstructRenderer` (the 2507 Instruct models, which never write `<think>`): no framing
  and no empty block; thinking parts, if a conversation has them, render `<think>{t}</think>`
  and are still stripped from history. It claims the prefix property, as the cookbook's does
  — true unless earlier assistant messages carry thinking parts (which such a model never
  writes; then stripping breaks it, as the cookbook's note says).
- Parsing: the text before `<|im_end|>` is split into thinking, text and tool calls
  (`parse_content_blocks`), thinking framing removed (`<think>\\n\\n</think>` is no part, the
  newlines after it are framing). Tool-call failures are `unparsed_tool_calls` on a clean
  termination; a response without `<|im_end|>` is `"malformed"` and left as plain text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlpure.render._chat import ChatTemplateRenderer, RenderContext, RenderedMessage
from rlpure.render._tools import (
    format_tool_calls,
    parse_content_blocks,
    tools_system_prompt,
    unterminated_tool_block,
)
from rlpure.render._types import (
    ContentPart,
    ParsedResponse,
    TokenizerLike,
    ToolCall,
    UnparsedToolCall,
    check_chat_messages,
    text_of_parts,
)

__all__ = ["Qwen3DisableThinkingRenderer", "Qwen3InstructRenderer", "Qwen3Renderer"]

_ROLES = ("system", "user", "assistant", "tool")
_EMPTY_BLOCK = "<think>\n\n</think>\n\n"


def _frame_thinking(reasoning: str) -> str:
    return "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n"


def _has_thinking(content: str | Sequence[Mapping[str, Any]]) -> bool:
    if isinstance(content, str):
        return "<think>" in content
    return any(part["type"] == "thinking" for part in content)


def _unframe_thinking(parts: Sequence[ContentPart]) -> list[ContentPart]:
    out: list[ContentPart] = []
    after_block = False
    for part in parts:
        if part["type"] == "thinking":
            reasoning = part["thinking"].strip("\n")
            if reasoning:
                out.append({"type": "thinking", "thinking": reasoning})
            after_block = True
        else:
            text = part["text"].lstrip("\n") if after_block else part["text"]
            out.append({"type": "text", "text": text})
            after_block = False
    return out


class Qwen3Renderer(ChatTemplateRenderer):
    """Qwen3 with thinking on (cookbook `qwen3`); layout in the module docstring.

    Args:
        tokenizer: a tokenizer with `<|im_start|>` and `<|im_end|>` as single tokens.
        strip_thinking_from_history: drop earlier turns' thinking, as Qwen3's template does
            (breaks the prefix property); False keeps it and gives the prefix property.
        encode_content: how message content is encoded (see `rlpure.render._chat`).

    Examples:
        >>> from rlpure.render._testing import SpecialWordTokenizer
        >>> tok = SpecialWordTokenizer()
        >>> r = Qwen3Renderer(tok)
        >>> tok.decode(r.build_generation_prompt([{"role": "user", "content": "hi"}]).to_ints())
        '<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n'
        >>> r.parse_response(tok.encode("<think>\\nhm\\n</think>\\n\\n4<|im_end|>")).parts
        ({'type': 'thinking', 'thinking': 'hm'}, {'type': 'text', 'text': '4'})
    """

    name = "qwen3"
    frames_thinking = True

    def __init__(
        self,
        tokenizer: TokenizerLike,
        *,
        strip_thinking_from_history: bool = True,
        encode_content: Callable[[str], Sequence[int]] | None = None,
    ) -> None:
        super().__init__(tokenizer, encode_content=encode_content)
        self.strip_thinking_from_history = strip_thinking_from_history
        self._im_end = self._single_token("<|im_end|>")

    @property
    def has_extension_property(self) -> bool:
        """False when earlier thinking is stripped (the default), True otherwise."""
        return not self.strip_thinking_from_history

    def get_stop_sequences(self) -> tuple[int, ...]:
        """The `<|im_end|>` token id."""
        return (self._im_end,)

    def tools_system_prompt(
        self, tools: Sequence[Mapping[str, Any]], system_prompt: str = ""
    ) -> str:
        """The system content declaring `tools` (`rlpure.render._tools.tools_system_prompt`)."""
        return tools_system_prompt(tools, system_prompt)

    def _check(self, messages: Sequence[Mapping[str, Any]]) -> None:
        check_chat_messages(messages, roles=_ROLES, thinking=True, tool_calls=True)

    def _frames(self, message: Mapping[str, Any], ctx: RenderContext) -> bool:
        if not self.frames_thinking or message["role"] != "assistant":
            return False
        if ctx.last_user_index < 0:
            return False
        return ctx.is_last or not self.strip_thinking_from_history

    def _render(self, message: Mapping[str, Any], ctx: RenderContext) -> RenderedMessage:
        role = "user" if message["role"] == "tool" else message["role"]
        newline = "\n" if ctx.idx > 0 else ""
        header = f"{newline}<|im_start|>{role}\n"
        content = message["content"]
        frames = self._frames(message, ctx)
        reasons = _has_thinking(content)
        if not isinstance(content, str):
            parts = list(content)
            if (
                self.strip_thinking_from_history
                and message["role"] == "assistant"
                and not ctx.is_last
            ):
                parts = [p for p in parts if p["type"] != "thinking"]
            pieces: list[str] = []
            after_block = False
            for part in parts:
                if part["type"] == "thinking":
                    thinking = part["thinking"]
                    pieces.append(
                        _frame_thinking(thinking) if frames else f"<think>{thinking}</think>"
                    )
                    after_block = frames
                else:
                    pieces.append(part["text"].lstrip("\n") if after_block else part["text"])
                    after_block = False
            text = "".join(pieces)
        elif frames and "</think>" in content:
            reasoning, _, rest = content.partition("</think>")
            text = _frame_thinking(reasoning.rpartition("<think>")[2]) + rest.lstrip("\n")
        else:
            text = content
        has_text = bool(text)
        if frames and not reasons:
            text = _EMPTY_BLOCK + text.lstrip("\n")
        if message["role"] == "tool":
            text = f"<tool_response>\n{text}\n</tool_response>"
        if "tool_calls" in message:
            text += ("\n" if has_text else "") + format_tool_calls(message["tool_calls"])
        return RenderedMessage(self._encode(header), [*self._encode_text(text), self._im_end])

    def parse_response(self, tokens: Sequence[int] | np.ndarray) -> ParsedResponse:
        """Sampled tokens (through `<|im_end|>`) read back as thinking, text and tool calls.

        Returns:
            `"stop_sequence"` with parts and tool calls parsed when there is one `<|im_end|>`;
            `"malformed"` with the plain decoded text when there is none.

        Raises:
            ValueError: for more than one `<|im_end|>` (wrong stop sequences when sampling).
        """
        text, stopped = self._split_on_stop_token(tokens, self._im_end)
        if not stopped:
            return ParsedResponse(content=text, termination="malformed")
        return _parse_blocks(text, unframe=self.frames_thinking)


def _parse_blocks(text: str, *, unframe: bool) -> ParsedResponse:
    blocks = parse_content_blocks(text)
    unparsed: list[UnparsedToolCall] = []
    calls: list[ToolCall] = []
    parts: tuple[ContentPart, ...] | None = None
    if blocks is not None:
        parts = tuple(_unframe_thinking(blocks.parts) if unframe else blocks.parts)
        calls = [c for c in blocks.calls if isinstance(c, ToolCall)]
        unparsed = [c for c in blocks.calls if isinstance(c, UnparsedToolCall)]
    dangling = unterminated_tool_block(text)
    if dangling is not None:
        unparsed.append(dangling)
    return ParsedResponse(
        content=text if parts is None else text_of_parts(parts),
        termination="stop_sequence",
        parts=parts,
        tool_calls=tuple(calls),
        unparsed_tool_calls=tuple(unparsed),
    )


class Qwen3DisableThinkingRenderer(Qwen3Renderer):
    """Qwen3 with thinking off (cookbook `qwen3_disable_thinking`): the prompt closes the block.

    Examples:
        >>> from rlpure.render._testing import SpecialWordTokenizer
        >>> tok = SpecialWordTokenizer()
        >>> r = Qwen3DisableThinkingRenderer(tok)
        >>> tok.decode(r.build_generation_prompt([{"role": "user", "content": "hi"}]).to_ints())
        '<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n'
    """

    name = "qwen3_disable_thinking"
    disables_thinking = True

    def _render(self, message: Mapping[str, Any], ctx: RenderContext) -> RenderedMessage:
        if (
            message["role"] == "assistant"
            and ctx.is_last
            and message["content"]
            and ctx.last_user_index < 0
        ):
            raise ValueError(
                f"messages[{ctx.idx}]: Qwen3's template writes no empty think block on a "
                "produced turn when the conversation has no user message, but the generation "
                "prompt always opens one; add a user message or render with thinking on"
            )
        return super()._render(message, ctx)

    def _generation_suffix(self, role: str, ctx: RenderContext) -> list[int]:
        newline = "\n" if ctx.idx > 0 else ""
        return self._encode(f"{newline}<|im_start|>{role}\n{_EMPTY_BLOCK}")


class Qwen3InstructRenderer(Qwen3Renderer):
    """Qwen3 Instruct 2507 (cookbook `qwen3_instruct`): the Qwen3 layout without `<think>` framing.

    Examples:
        >>> from rlpure.render._testing import SpecialWordTokenizer
        >>> tok = SpecialWordTokenizer()
        >>> r = Qwen3InstructRenderer(tok)
        >>> chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
        >>> tok.decode(r.build_supervised_example(chat).model_input.to_ints())[-34:]
        '<|im_start|>assistant\\nyo<|im_end|>'
    """

    name = "qwen3_instruct"
    frames_thinking = False

    @property
    def has_extension_property(self) -> bool:
        """True (see the module docstring for the exception the cookbook also has)."""
        return True
