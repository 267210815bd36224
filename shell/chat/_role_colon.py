"""The cookbook's `role_colon` renderer (`tinker_cookbook.renderers.role_colon`), over `rlpure.render`.

Conventions:
- Tokens are `rlpure.render.RoleColonRenderer`'s (layout in its module docstring); this class
  converts at the edge: message content through `ensure_text`, prompts to `tinker.ModelInput`,
  parse results to `ParseResult(message, ParseTermination)`, weights to a float32 array.
- Token ids equal the cookbook's `RoleColonRenderer` whenever the tokenizer encodes its BOS
  text as its BOS id (every Hugging Face tokenizer; the local `ByteTokenizer` too). The BOS is
  taken from `tokenizer.bos_token_id`; the cookbook encodes the text `tokenizer.bos_token`.
- Deliberate differences from the cookbook (`tests/parity/test_renderer_parity.py` pins each):
  - `parse_response` keeps a content's trailing blank line before the stop sequence, so it
    inverts rendering exactly (`" a\\n\\n\\n\\nUser:"` → `"a\\n\\n"`; the cookbook's `"a"`).
    `strip_blank_line_before_stop=True` gives the cookbook's result.
  - A supervised example whose last message is not the assistant's ends with that message's
    output; the cookbook appends the encoded placeholder text `"<UNUSED>"` (a bug: its own
    comment says the placeholder is never concatenated).
  - Bad messages raise `TypeError`/`ValueError`/`RendererError` naming the message and key
    (the cookbook's `KeyError` or `AssertionError`); an empty conversation is refused by
    `build_supervised_example`.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tinker

from rlpure import render
from shell import tokenizers
from shell.chat._base import (
    Message,
    ParseResult,
    ParseTermination,
    Renderer,
    Role,
    ToolSpec,
    TrainOnWhat,
    _check_mapping,
    _register_builtin_renderer,
    ensure_text,
)

__all__ = ["RoleColonRenderer"]


def _text_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    _check_mapping(messages)
    return [{"role": m["role"], "content": ensure_text(m["content"])} for m in messages]


class RoleColonRenderer(Renderer):
    """`Role: content` turns (DeepSeek R1-Zero's format), stop sequence `"\\n\\nUser:"`.

    Args:
        tokenizer: any `rlpure.render.TokenizerLike` (a Hugging Face tokenizer, the local
            `ByteTokenizer`).
        strip_blank_line_before_stop: parse as the cookbook does (see the module docstring).

    Examples:
        >>> from rlpure.model import ByteTokenizer
        >>> renderer = RoleColonRenderer(ByteTokenizer())
        >>> prompt = renderer.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        >>> renderer.tokenizer.decode(prompt.to_ints())
        '<|bos|>User: 2+2?\\n\\nAssistant:'
        >>> message, termination = renderer.parse_response(list(b" 4\\n\\nUser:"))
        >>> message, termination.is_stop_sequence
        ({'role': 'assistant', 'content': '4'}, True)
    """

    def __init__(self, tokenizer: Any, *, strip_blank_line_before_stop: bool = False) -> None:
        super().__init__(tokenizer)
        self._core = render.RoleColonRenderer(tokenizer)
        self.strip_blank_line_before_stop = strip_blank_line_before_stop
        self._renderer_name = "role_colon"
        self._model_name = getattr(tokenizer, "name_or_path", None)

    def __repr__(self) -> str:
        return f"RoleColonRenderer(tokenizer={type(self.tokenizer).__name__})"

    def __reduce__(self) -> tuple[Any, ...]:
        if self._model_name is None:
            raise pickle.PicklingError(
                "Cannot pickle RoleColonRenderer: its tokenizer has no name_or_path; pass "
                "model_name= to shell.chat.get_renderer()"
            )
        return (_unpickle_role_colon, (self._model_name, self.strip_blank_line_before_stop))

    @property
    def has_extension_property(self) -> bool:
        """True: earlier turns render the same in every prefix."""
        return True

    def get_stop_sequences(self) -> list[str]:
        """`["\\n\\nUser:"]`."""
        return list(self._core.get_stop_sequences())

    def build_generation_prompt(
        self, messages: list[Message], role: Role = "assistant", prefill: str | None = None
    ) -> tinker.ModelInput:
        """`[BOS] {Role}: {content}\\n\\n ... {Role}:`, then `prefill`'s tokens when given."""
        tokens = self._core.build_generation_prompt(_text_messages(messages), role=role).to_ints()
        if prefill:
            tokens += tokenizers.encode_without_special_tokens(self.tokenizer, prefill)
        return tinker.ModelInput.from_ints(tokens)

    def parse_response(self, response: Sequence[int] | np.ndarray) -> ParseResult:
        """Sampled tokens (stop sequence or EOS included) read back as the assistant's message.

        Returns:
            `ParseResult(message, termination)`: `STOP_SEQUENCE` for one `"\\n\\nUser:"` and no
            EOS after it; `EOS` for a trailing EOS without a stop sequence; `MALFORMED`
            otherwise (truncated, several stop sequences, a stop sequence then EOS).
        """
        parsed = self._core.parse_response(
            response, strip_blank_line_before_stop=self.strip_blank_line_before_stop
        )
        message: Message = {"role": "assistant", "content": parsed.content}
        return ParseResult(message, ParseTermination(parsed.termination))

    def build_supervised_example(
        self,
        messages: list[Message],
        train_on_what: TrainOnWhat | str = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
    ) -> tuple[tinker.ModelInput, np.ndarray]:
        """Tokens of `messages` and float32 `[T]` weights (`rlpure.render` layout and modes).

        Raises:
            ValueError: for an unknown `train_on_what`, or `trainable` flags present without
                `CUSTOMIZED` / missing with it.
        """
        try:
            mode = TrainOnWhat(train_on_what)
        except ValueError:
            raise ValueError(
                f"build_supervised_example: unknown train_on_what {train_on_what!r}; "
                f"known: {[m.value for m in TrainOnWhat]}"
            ) from None
        _check_mapping(messages)
        flagged = [i for i, m in enumerate(messages) if "trainable" in m]
        trainable_M: list[bool] | None = None
        if mode is TrainOnWhat.CUSTOMIZED:
            if len(flagged) != len(messages):
                missing = sorted(set(range(len(messages))) - set(flagged))
                raise ValueError(
                    f"build_supervised_example: train_on_what=CUSTOMIZED needs a 'trainable' "
                    f"flag on every message; messages{missing} have none"
                )
            trainable_M = [bool(m["trainable"]) for m in messages]
        elif flagged:
            raise ValueError(
                f"build_supervised_example: messages{flagged} carry 'trainable' flags, which "
                f"only train_on_what=CUSTOMIZED reads (got {mode.name})"
            )
        example = self._core.build_supervised_example(
            _text_messages(messages), train_on=mode.value, trainable_M=trainable_M
        )
        return tinker.ModelInput.from_ints(example.model_input.to_ints()), example.weights_T

    def create_conversation_prefix_with_tools(
        self, tools: list[ToolSpec], system_prompt: str = ""
    ) -> list[Message]:
        """Not supported: `role_colon` has no tool-calling convention.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError("RoleColonRenderer does not support tool calling")


def _unpickle_role_colon(model_name: str, strip_blank_line_before_stop: bool) -> RoleColonRenderer:
    """Rebuilds a pickled `RoleColonRenderer` with its tokenizer from `get_tokenizer`."""
    renderer = RoleColonRenderer(
        tokenizers.get_tokenizer(model_name),
        strip_blank_line_before_stop=strip_blank_line_before_stop,
    )
    renderer._model_name = model_name
    return renderer


def _role_colon_factory(tokenizer: Any, image_processor: Any) -> Renderer:
    return RoleColonRenderer(tokenizer)


_register_builtin_renderer("role_colon", _role_colon_factory)
