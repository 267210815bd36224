"""Assembly shared by the chat-template renderers (`chatml`, `qwen3`, `llama3`).

Conventions (the cookbook's `Renderer.build_generation_prompt` / `build_supervised_example`):
- Each message renders to a header (role markers; what the model is shown) and an output
  (content and end-of-turn token; what the model writes), each encoded on its own. Position
  matters to some formats, so rendering sees a `RenderContext`: the message index, whether it
  is the last message of the list being rendered, and the index of the last user message.
- Prompt: `[BOS] + header_0 + output_0 + ... + suffix(role)`, the suffix being the header of
  the turn to write (plus a prefill where the format closes a think block).
- Supervised example: `[BOS] + header_0 + output_0 + ...`; weights 0 on BOS, 0 on headers (1
  under `"all_tokens"`), and on each output 0 or 1 by `output_is_trained`. Then, for
  `"last_assistant_message"` / `"last_assistant_turn"`, the first trained message's prompt
  (`build_generation_prompt(messages[:boundary])`) gets weight 0 where the example starts with
  it — so a prefill the prompt supplies (qwen3_disable_thinking's empty think block) is never
  trained. An example that does not start with its prompt is refused for renderers that
  close the think block (`disables_thinking`): it would teach reasoning after being told not
  to. (The cookbook's `_train_after_the_generation_prompt`.)
- `parse_response` splits on the stop token: none is `"malformed"` (truncated), one is
  `"stop_sequence"`, more than one is a `ValueError` (the sampler was given the wrong stop
  sequences).
- The `encode_content` option encodes message content; give one that spells special-token
  text literally (the shell builds it from a Hugging Face backend with
  `encode_special_tokens=True`, as the cookbook's qwen3 does), so a user's `"<|im_end|>"` is
  text, not a turn end. Default: `tokenizer.encode(text, add_special_tokens=False)`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from rlpure.records import ModelInput
from rlpure.render._types import (
    SupervisedExample,
    TokenizerLike,
    TrainOn,
    check_train_on,
    output_is_trained,
)

__all__ = ["RenderContext"]


class RenderContext(NamedTuple):
    """Where a message sits in the list being rendered.

    Attributes:
        idx: its index (`len(messages)` for the generation suffix).
        is_last: whether it is the last message (True for the generation suffix).
        last_user_index: index of the last user message, -1 when there is none.
    """

    idx: int
    is_last: bool
    last_user_index: int


class RenderedMessage(NamedTuple):
    """One message's header and output tokens."""

    header: list[int]
    output: list[int]


def _last_user_index(messages: Sequence[Mapping[str, Any]]) -> int:
    return max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)


class ChatTemplateRenderer:
    """Base of the chat-template renderers: subclasses render one message and the suffix."""

    disables_thinking: bool = False
    name: str = ""

    def __init__(
        self,
        tokenizer: TokenizerLike,
        *,
        encode_content: Callable[[str], Sequence[int]] | None = None,
    ) -> None:
        for attr in ("encode", "decode"):
            if not hasattr(tokenizer, attr):
                raise TypeError(
                    f"{type(self).__name__}: tokenizer {type(tokenizer).__name__} has no {attr!r}"
                )
        self.tokenizer = tokenizer
        self._encode_content = encode_content

    def __repr__(self) -> str:
        return f"{type(self).__name__}(tokenizer={type(self.tokenizer).__name__})"

    # --- pieces subclasses use ----------------------------------------------------------------

    def _encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]

    def _encode_text(self, text: str) -> list[int]:
        if self._encode_content is None:
            return self._encode(text)
        return [int(t) for t in self._encode_content(text)]

    def _single_token(self, text: str) -> int:
        tokens = self._encode(text)
        if len(tokens) != 1:
            raise ValueError(
                f"{type(self).__name__}: the tokenizer encodes {text!r} as {len(tokens)} tokens "
                f"{tokens}; this format needs it to be one special token"
            )
        return tokens[0]

    # --- what subclasses implement --------------------------------------------------------------

    def _check(self, messages: Sequence[Mapping[str, Any]]) -> None:
        raise NotImplementedError

    def _bos(self) -> list[int]:
        return []

    def _messages(self, messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The messages as rendered (a format may add a default system message)."""
        return list(messages)

    def _render(self, message: Mapping[str, Any], ctx: RenderContext) -> RenderedMessage:
        raise NotImplementedError

    def _generation_suffix(self, role: str, ctx: RenderContext) -> list[int]:
        return self._render({"role": role, "content": ""}, ctx).header

    # --- protocol -----------------------------------------------------------------------------

    @property
    def has_extension_property(self) -> bool:
        """Whether each turn's prompt extends the previous prompt plus its sampled output."""
        return True

    def build_generation_prompt(
        self, messages: Sequence[Mapping[str, Any]], *, role: str = "assistant"
    ) -> ModelInput:
        """`[BOS] + header + output per message + the header of the turn to write`.

        Args:
            messages: the conversation so far (may be empty).
            role: the role whose message the model writes next.

        Returns:
            int32 `[T]` prompt tokens.

        Raises:
            TypeError, ValueError: for a bad message, naming its index and field.
        """
        self._check(messages)
        rendered = self._messages(messages)
        last_user = _last_user_index(rendered)
        tokens = self._bos()
        for idx, message in enumerate(rendered):
            piece = self._render(message, RenderContext(idx, idx == len(rendered) - 1, last_user))
            tokens += piece.header + piece.output
        tokens += self._generation_suffix(role, RenderContext(len(rendered), True, last_user))
        return ModelInput.from_ints(tokens)

    def build_supervised_example(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        train_on: TrainOn = "last_assistant_message",
        trainable_M: Sequence[bool] | None = None,
    ) -> SupervisedExample:
        """Tokens of `messages` with weight 1 on the outputs `train_on` selects.

        Args:
            messages: a non-empty conversation.
            train_on: which outputs to train on (`rlpure.render.TrainOn`).
            trainable_M: one flag per message, required with (and only with) `"customized"`.

        Returns:
            The tokens and float32 `[T]` weights (layout in the module docstring).

        Raises:
            ValueError: for an empty conversation, a bad `train_on`/`trainable_M`, or (for a
                `disables_thinking` renderer) a trained turn that reasons.
        """
        self._check(messages)
        if not messages:
            raise ValueError("build_supervised_example: messages is empty")
        check_train_on(train_on, trainable_M, len(messages))
        rendered = self._messages(messages)
        offset = len(rendered) - len(messages)
        last_user = _last_user_index(rendered)
        turn_start = 1 + _last_user_index(messages[:-1])
        header_weight = 1.0 if train_on == "all_tokens" else 0.0
        tokens = self._bos()
        weights = [0.0] * len(tokens)
        for idx, message in enumerate(rendered):
            piece = self._render(message, RenderContext(idx, idx == len(rendered) - 1, last_user))
            given = idx - offset
            if given < 0:  # a default system message the format adds: framing, never trained
                trained = False
            else:
                trained = output_is_trained(
                    train_on,
                    role=message["role"],
                    is_last=given == len(messages) - 1,
                    in_last_turn=given >= turn_start,
                    trainable=bool(trainable_M[given]) if trainable_M is not None else False,
                )
            tokens += piece.header + piece.output
            weights += [header_weight] * len(piece.header)
            weights += [1.0 if trained else 0.0] * len(piece.output)
        weights = self._zero_the_prompt(messages, train_on, tokens, weights)
        return SupervisedExample(
            model_input=ModelInput.from_ints(tokens), weights_T=np.asarray(weights, np.float32)
        )

    def _zero_the_prompt(
        self,
        messages: Sequence[Mapping[str, Any]],
        train_on: str,
        tokens: list[int],
        weights: list[float],
    ) -> list[float]:
        if train_on == "last_assistant_message":
            boundary = len(messages) - 1
        elif train_on == "last_assistant_turn":
            boundary = 1 + _last_user_index(messages)
        else:
            return weights
        if not 0 <= boundary < len(messages) or messages[boundary]["role"] != "assistant":
            return weights
        prompt = self.build_generation_prompt(messages[:boundary]).to_ints()
        if tokens[: len(prompt)] != prompt:
            if self.disables_thinking:
                raise ValueError(
                    f"{type(self).__name__}: messages[{boundary}] reasons, but thinking is "
                    "turned off (the generation prompt closes the think block); use the "
                    "thinking renderer or remove the reasoning from that turn"
                )
            return weights
        return [0.0] * len(prompt) + weights[len(prompt) :]

    def _split_on_stop_token(
        self, tokens: Sequence[int] | np.ndarray, stop_token: int
    ) -> tuple[str, bool]:
        """The decoded text before the stop token, and whether there was one."""
        ids = [int(t) for t in np.asarray(tokens, dtype=np.int64).reshape(-1)]
        count = ids.count(stop_token)
        if count > 1:
            raise ValueError(
                f"{type(self).__name__}.parse_response: {count} stop tokens ({stop_token}) in "
                "one response; expected at most 1 (sample with this renderer's stop sequences)"
            )
        if count == 0:
            return str(self.tokenizer.decode(ids)), False
        return str(self.tokenizer.decode(ids[: ids.index(stop_token)])), True
