"""The `role_colon` renderer (DeepSeek R1-Zero's `Role: content` format) as pure functions.

Conventions:
- A message is a `{"role": str, "content": str}` mapping (`Message`); content is plain text.
- A tokenizer is any object with the Hugging Face-like surface of `TokenizerLike`:
  `encode(text, add_special_tokens=False) -> list[int]`, `decode(ids) -> str`, and
  `bos_token_id` / `eos_token_id` (int or None). The renderer only calls these; it holds no
  other state, so rendering is a pure function of (tokenizer, messages).
- Token layout of `role_colon` (the tinker-cookbook `RoleColonRenderer` format). Each piece is
  encoded on its own and the token lists are concatenated — the prompt is NOT the encoding of
  the joined string, which matters for merging tokenizers (BPE):

      [bos_token_id if not None]
      + for each message:  encode("{Role}:") + encode(" {content}\\n\\n")
      + encode("Assistant:")                       # the generation header

  giving the text `User: {q}\\n\\nAssistant:` for one user message. `Role` is the role with its
  first letter upper-cased (`str.capitalize`). The model continues with `" {answer}\\n\\nUser:"`
  and sampling stops at the stop sequence `"\\n\\nUser:"`.
- Termination of a parsed response (`ParsedResponse.termination`):
  `"stop_sequence"` — the text contains exactly one `"\\n\\nUser:"` and no trailing EOS;
  `"eos"` — no stop sequence, the last token is EOS;
  `"malformed"` — no stop sequence and no EOS (truncated by `max_tokens`), a stop sequence
  followed by EOS, or several stop sequences (the model wrote the user's turn).
- Supervised examples (`SupervisedExample`) weigh each token 0.0 or 1.0: BOS always 0, headers
  0 (1 only under `train_on="all_tokens"`), each message's output 1 when `train_on` selects
  it — and for the last message also the `"User:"` that completes its stop sequence, with the
  last output's weight, so the model learns to stop. The `train_on` values and which outputs
  they select are the cookbook's `TrainOnWhat` (see `build_supervised_example`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from rlpure.records import ModelInput
from rlpure.render._types import (
    ParsedResponse,
    SupervisedExample,
    Termination,
    TokenizerLike,
    TrainOn,
    check_text_messages,
    check_train_on,
    output_is_trained,
)

__all__ = ["RoleColonRenderer"]


_CONTENT_PREFIX = " "
_CONTENT_SUFFIX = "\n\n"
_STOP_SEQUENCE = "\n\nUser:"
_STOP_OVERLAP = "User:"  # what the stop sequence adds after an assistant output's "\n\n"


class RoleColonRenderer:
    """The `Role: content` format of DeepSeek R1-Zero (cookbook `role_colon`).

    Examples:
        >>> class Chars:  # one token per character, BOS = 0
        ...     bos_token_id, eos_token_id = 0, 1
        ...     def encode(self, text, add_special_tokens=False): return [ord(c) for c in text]
        ...     def decode(self, ids): return "".join(chr(i) for i in ids)
        >>> r = RoleColonRenderer(Chars())
        >>> prompt = r.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        >>> prompt.to_ints()[0], Chars().decode(prompt.to_ints()[1:])
        (0, 'User: 2+2?\\n\\nAssistant:')
        >>> r.parse_response(Chars().encode(" 4\\n\\nUser:"))
        ParsedResponse(content='4', termination='stop_sequence')
    """

    __slots__ = ("tokenizer",)

    def __init__(self, tokenizer: TokenizerLike) -> None:
        for attr in ("encode", "decode", "bos_token_id", "eos_token_id"):
            if not hasattr(tokenizer, attr):
                raise TypeError(
                    f"RoleColonRenderer: tokenizer {type(tokenizer).__name__} has no {attr!r}"
                )
        self.tokenizer = tokenizer

    def __repr__(self) -> str:
        return f"RoleColonRenderer(tokenizer={type(self.tokenizer).__name__})"

    # --- pieces -----------------------------------------------------------------------------

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _bos_tokens(self) -> list[int]:
        bos = self.tokenizer.bos_token_id
        return [] if bos is None else [int(bos)]

    def _header_tokens(self, role: str) -> list[int]:
        return self._encode(role.capitalize() + ":")

    def _output_tokens(self, content: str) -> list[int]:
        return self._encode(_CONTENT_PREFIX + content + _CONTENT_SUFFIX)

    # --- protocol ---------------------------------------------------------------------------

    @property
    def has_extension_property(self) -> bool:
        """True: earlier turns render the same in every prefix."""
        return True

    def get_stop_sequences(self) -> tuple[str, ...]:
        """`("\\n\\nUser:",)`."""
        return (_STOP_SEQUENCE,)

    def build_generation_prompt(
        self, messages: Sequence[Mapping[str, str]], *, role: str = "assistant"
    ) -> ModelInput:
        """`[BOS] {Role}: {content}\\n\\n ... {Role}:` as tokens (layout in the module docstring).

        Args:
            messages: the conversation so far (may be empty).
            role: the role whose message the model writes next.

        Returns:
            int32 `[T]` prompt tokens.

        Raises:
            TypeError, ValueError: naming the offending message index and key.
        """
        check_text_messages(messages)
        tokens = self._bos_tokens()
        for message in messages:
            tokens += self._header_tokens(message["role"])
            tokens += self._output_tokens(message["content"])
        tokens += self._header_tokens(role)
        return ModelInput.from_ints(tokens)

    def parse_response(
        self, tokens: Sequence[int] | np.ndarray, *, strip_blank_line_before_stop: bool = False
    ) -> ParsedResponse:
        """Reads sampled tokens back as the assistant's content and how they ended.

        One trailing EOS token is removed, the rest decoded and split on `"\\n\\nUser:"`. The
        content is the text before the first stop sequence with the rendered leading space
        removed; without a stop sequence, a trailing `"\\n\\n"` (the rendered content suffix,
        written before an EOS) is removed too.

        Unlike the cookbook, `"\\n\\n"` is not stripped when a stop sequence was found: the
        stop sequence already consumed the suffix, so `parse_response` inverts rendering
        exactly, also for content ending in a blank line.

        Args:
            tokens: int `[T]` sampled token ids (stop sequence included, as the sampler
                returns it).
            strip_blank_line_before_stop: also remove a trailing `"\\n\\n"` from the content
                when a stop sequence was found (the cookbook's behaviour).

        Returns:
            The parsed response (see the module docstring for the termination rules).
        """
        ids = [int(t) for t in np.asarray(tokens, dtype=np.int64).reshape(-1)]
        eos = self.tokenizer.eos_token_id
        ended_with_eos = eos is not None and bool(ids) and ids[-1] == int(eos)
        if ended_with_eos:
            ids = ids[:-1]
        text = str(self.tokenizer.decode(ids))
        pieces = text.split(_STOP_SEQUENCE)
        content = pieces[0].removeprefix(_CONTENT_PREFIX)
        termination: Termination
        if len(pieces) == 1 or strip_blank_line_before_stop:
            content = content.removesuffix(_CONTENT_SUFFIX)
        if len(pieces) == 1:
            termination = "eos" if ended_with_eos else "malformed"
        elif len(pieces) == 2 and not ended_with_eos:
            termination = "stop_sequence"
        else:
            termination = "malformed"
        return ParsedResponse(content=content, termination=termination)

    def build_supervised_example(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        train_on: TrainOn = "last_assistant_message",
        trainable_M: Sequence[bool] | None = None,
    ) -> SupervisedExample:
        """Tokens of `messages` with weight 1 on the outputs the model should learn.

        The tokens are `[BOS]` and, per message, its header `"{Role}:"` and output
        `" {content}\\n\\n"`; when the last message is the assistant's, `"User:"` follows
        (completing the stop sequence) with the last output's weight. The tokens before the last
        output are `build_generation_prompt(messages[:-1], role=messages[-1]["role"])`.

        Which outputs weigh 1 (`train_on`, the cookbook's `TrainOnWhat`):
        `"last_assistant_message"`: the last message, if it is the assistant's;
        `"last_assistant_turn"`: assistant messages after the last user message of
        `messages[:-1]`; `"all_assistant_messages"`: every assistant message (sound for
        `role_colon`, whose earlier turns render the same in every prefix); `"all_messages"`:
        every message; `"all_tokens"`: every message and header (BOS stays 0);
        `"all_user_and_system_messages"`: user and system messages; `"customized"`: message
        `m` when `trainable_M[m]`.

        Args:
            messages: a non-empty conversation.
            train_on: which outputs to train on (above).
            trainable_M: one flag per message, required with (and only with) `"customized"`.

        Returns:
            The tokens and float32 `[T]` weights.

        Raises:
            ValueError: for an empty conversation, an unknown `train_on`, or `trainable_M`
                missing, of the wrong length, or given without `"customized"`.
        """
        check_text_messages(messages)
        if not messages:
            raise ValueError("build_supervised_example: messages is empty")
        check_train_on(train_on, trainable_M, len(messages))
        last = len(messages) - 1
        turn_start = 1 + max(
            (i for i, m in enumerate(messages[:last]) if m["role"] == "user"), default=-1
        )
        header_weight = 1.0 if train_on == "all_tokens" else 0.0
        tokens: list[int] = self._bos_tokens()
        weights: list[float] = [0.0] * len(tokens)
        for i, message in enumerate(messages):
            role = message["role"]
            trained = output_is_trained(
                train_on,
                role=role,
                is_last=i == last,
                in_last_turn=i >= turn_start,
                trainable=bool(trainable_M[i]) if trainable_M is not None else False,
            )
            header = self._header_tokens(role)
            output = self._output_tokens(message["content"])
            if i == last and role == "assistant":
                output += self._encode(_STOP_OVERLAP)
            tokens += header + output
            weights += [header_weight] * len(header) + [1.0 if trained else 0.0] * len(output)
        return SupervisedExample(
            model_input=ModelInput.from_ints(tokens), weights_T=np.asarray(weights, np.float32)
        )
