"""`role_colon` with Hermes tool calls: the chat format of the agent demo's byte-level toy model.

Part of `rlpure agent` (see `shell.jobs.tools`). Why not a chat renderer: `chatml`, `qwen3`
and `llama3` need their turn markers (`<|im_end|>`, `<|eot_id|>`) as single special tokens,
and the toy model's `ByteTokenizer` has only BOS/EOS/PAD (they refuse it with a
`RendererError`); the toy vocabulary (259 ids) has no room for more. `role_colon` works with any
tokenizer but has no tool-calling convention, so this renderer adds one, in the text:

- An assistant message renders its text, then (after `"\\n"` when there is text) its tool
  calls as Hermes blocks `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
  (`rlpure.render.format_tool_calls`, the `qwen3` / `chatml` layout).
- A `tool` message renders as a *user* turn `User: <tool_response>{content}</tool_response>`,
  as Qwen's and Hermes' chat templates put tool results in a user turn. So every assistant
  turn — a tool call or the final answer — ends with the one stop sequence `"\\n\\nUser:"`,
  and each turn's prompt extends the previous prompt plus its sampled turn (one datum per
  episode).
- `parse_response` is `role_colon`'s, then `<tool_call>` blocks are split off the content:
  good ones into `tool_calls`, malformed ones (bad JSON, no name, unterminated block) into
  `unparsed_tool_calls`, for `AgentToolMessageEnv`'s parse-error handling.
- Supervised examples: as `role_colon`'s, plus weight 1 on the `"User:"` header after every
  trained assistant message (not only the last), so the model learns to end a tool-call turn
  with the stop sequence too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tinker

from rlpure import render
from shell.chat import (
    Message,
    ParseResult,
    Role,
    RoleColonRenderer,
    ToolCall,
    ToolSpec,
    TrainOnWhat,
    UnparsedToolCall,
    get_text_content,
)

__all__ = ["RoleColonToolRenderer"]

TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
_CALL_OPEN = "<tool_call>"
_CALL_CLOSE = "</tool_call>"


def _core_call(call: ToolCall) -> render.ToolCall:
    return render.ToolCall(name=call.function.name, arguments=call.function.arguments, id=call.id)


def _text_message(message: Message) -> Message:
    """The message as the plain-text `role_colon` message it renders as."""
    role = message["role"]
    text = get_text_content(message)
    if role == "tool":
        return {"role": "user", "content": f"{TOOL_RESPONSE_OPEN}{text}{TOOL_RESPONSE_CLOSE}"}
    calls = message.get("tool_calls") or []
    if role == "assistant" and calls:
        blocks = render.format_tool_calls([_core_call(c) for c in calls])
        text = f"{text}\n{blocks}" if text else blocks
    out: Message = {"role": role, "content": text}
    if "trainable" in message:
        out["trainable"] = message["trainable"]
    return out


class RoleColonToolRenderer(RoleColonRenderer):
    """`role_colon` turns with Hermes tool calls in the text (layout in the module docstring).

    Examples:
        >>> from rlpure.model import ByteTokenizer
        >>> r = RoleColonToolRenderer(ByteTokenizer())
        >>> reply = r.parse_response(list(b' <tool_call>{"name": "f", "arguments": {}}'
        ...                               b'</tool_call>\\n\\nUser:'))
        >>> reply.message["tool_calls"][0].function.name, reply.message["content"]
        ('f', '')
    """

    def __repr__(self) -> str:
        return f"RoleColonToolRenderer(tokenizer={type(self.tokenizer).__name__})"

    def build_generation_prompt(
        self, messages: list[Message], role: Role = "assistant", prefill: str | None = None
    ) -> tinker.ModelInput:
        """`role_colon`'s prompt of the messages rendered as text (tool calls, results)."""
        return super().build_generation_prompt(
            [_text_message(m) for m in messages], role=role, prefill=prefill
        )

    def parse_response(self, response: Sequence[int] | np.ndarray) -> ParseResult:
        """`role_colon`'s parse, with `<tool_call>` blocks moved to `tool_calls` /
        `unparsed_tool_calls` and the `"\\n"` before them removed from the text."""
        parsed = super().parse_response(response)
        content = get_text_content(parsed.message)
        blocks = render.parse_content_blocks(content)
        unterminated = content.count(_CALL_OPEN) > content.count(_CALL_CLOSE)
        if blocks is None and not unterminated:
            return parsed
        message: Message = {"role": "assistant", "content": content}
        calls: list[ToolCall] = []
        unparsed: list[UnparsedToolCall] = []
        if blocks is not None:
            message["content"] = "".join(
                p["text"] for p in blocks.parts if p["type"] == "text"
            ).rstrip("\n")
            for call in blocks.calls:
                if isinstance(call, render.ToolCall):
                    body = ToolCall.FunctionBody(name=call.name, arguments=call.arguments)
                    calls.append(ToolCall(function=body, id=call.id))
                else:
                    unparsed.append(UnparsedToolCall(raw_text=call.raw_text, error=call.error))
        if unterminated:
            unparsed.append(
                UnparsedToolCall(
                    raw_text=content[content.rfind(_CALL_OPEN) :],
                    error=f"unterminated tool block: '{_CALL_OPEN}' opened without a matching "
                    f"'{_CALL_CLOSE}'",
                )
            )
        if calls:
            message["tool_calls"] = calls
        if unparsed:
            message["unparsed_tool_calls"] = unparsed
        return ParseResult(message, parsed.termination)

    def build_supervised_example(
        self,
        messages: list[Message],
        train_on_what: TrainOnWhat | str = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
    ) -> tuple[tinker.ModelInput, np.ndarray]:
        """`role_colon`'s example of the text messages, with each trained assistant message's
        following `"User:"` header weighted as its output (it completes the stop sequence)."""
        text_messages = [_text_message(m) for m in messages]
        model_input, weights_T = super().build_supervised_example(text_messages, train_on_what)
        weights_T = np.array(weights_T, np.float32)
        position = 0 if self.tokenizer.bos_token_id is None else 1
        previous_weight = 0.0
        for i, message in enumerate(text_messages):
            header = self._length(message["role"].capitalize() + ":")
            output = self._length(f" {get_text_content(message)}\n\n")
            if i > 0 and text_messages[i - 1]["role"] == "assistant" and previous_weight > 0:
                weights_T[position : position + header] = previous_weight
            previous_weight = float(weights_T[position + header]) if output else 0.0
            position += header + output
        return model_input, weights_T

    def _length(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def create_conversation_prefix_with_tools(
        self, tools: list[ToolSpec], system_prompt: str = ""
    ) -> list[Message]:
        """A system message declaring `tools` (the Qwen3 wording of `rlpure.render`)."""
        return [{"role": "system", "content": render.tools_system_prompt(tools, system_prompt)}]
