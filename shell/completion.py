"""Policies over tokens and over messages (tinker-cookbook 0.6.1's `completers` API).

Conventions:
- A `TokenCompleter` maps an observation and a stop condition to one sampled action
  (`TokensWithLogprobs`: int32 tokens, float32 sampling logprobs, stop reason), with the
  cookbook's optional per-call cap `max_tokens` (rollout runners use it for per-turn budgets;
  they pass it only when a budget applies). The shell's rollouts pass `rlpure.records.ModelInput`
  observations; `TinkerTokenCompleter` also takes a `tinker.ModelInput` (what cookbook envs and
  renderers produce, sent to the sampler as is, all chunk kinds kept) or a list of token ids.
- A `MessageCompleter` maps a conversation to the next assistant `Message` (via a renderer).
- The sampling client is a `shell.clients.SamplingClient`: the real `tinker.SamplingClient`,
  the local backend's and `shell.fakes.FakeSamplingClient` all offer the SDK 0.38 call
  `sample(prompt=..., num_samples=..., sampling_params=...)`, which returns an awaitable
  `APIFuture` at once. No retry loop wraps SDK calls here: the SDK retries transient failures
  itself.
- When a `seed` is given, call `n` of the completer samples with `seed + n`, so a run with a
  deterministic scheduler (the local backend) is reproducible while the `G` samples of a group
  still differ.
- This is the only place where `rlpure` records are converted to and from the SDK's
  `tinker.ModelInput` / `tinker.SampleResponse`.

Differences from the cookbook: `TokensWithLogprobs` is `rlpure.records`' frozen record (numpy
arrays; the cookbook's `maybe_logprobs` is a property of it); `TokenCompleter` and
`MessageCompleter` are protocols (subclassing them, as cookbook code does, still works).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeAlias, cast

import numpy as np
import tinker

from rlpure.records import ModelInput, TokensWithLogprobs, as_stop_condition
from rlpure.records import StopCondition as _CoreStopCondition
from shell.chat import Message
from shell.clients import SamplingClient

__all__ = [
    "MessageCompleter",
    "StopCondition",
    "TinkerMessageCompleter",
    "TinkerTokenCompleter",
    "TokenCompleter",
    "TokensWithLogprobs",
    "model_input_from_tinker",
    "model_input_to_tinker",
    "tokens_with_logprobs_from_sequence",
]

StopCondition: TypeAlias = Sequence[str | int]
"""Stop strings or stop token ids, all of one kind (the cookbook's `list[str] | list[int]`;
tuples, as `rlpure.records.StopCondition`, also do)."""


class TokenCompleter(Protocol):
    """A policy over tokens: observation and stop condition in, one sampled action out."""

    async def __call__(
        self, model_input: ModelInput, stop: _CoreStopCondition, *, max_tokens: int | None = None
    ) -> TokensWithLogprobs:
        """Samples one action.

        Args:
            model_input: the observation, int32 tokens `[T_ob]`.
            stop: stop strings or stop token ids.
            max_tokens: a per-call cap on sampled tokens, combined with the completer's own by
                taking the minimum; None for no per-call cap.

        Returns:
            The sampled tokens `[T_ac]`, their sampling logprobs `[T_ac]` and stop reason.
        """
        ...


class MessageCompleter(Protocol):
    """A policy over messages: a conversation in, the next assistant message out."""

    async def __call__(self, messages: list[Message]) -> Message:
        """Samples the next assistant message (with `tool_calls` when the model made any)."""
        ...


def model_input_to_tinker(model_input: ModelInput) -> tinker.ModelInput:
    """`rlpure.records.ModelInput` → `tinker.ModelInput` (one text chunk)."""
    return tinker.ModelInput.from_ints(model_input.to_ints())


def model_input_from_tinker(model_input: tinker.ModelInput) -> ModelInput:
    """`tinker.ModelInput` (text chunks only) → `rlpure.records.ModelInput`."""
    return ModelInput.from_ints(model_input.to_ints())


def _tinker_prompt(model_input: object) -> tinker.ModelInput:
    """An observation in any accepted form → the `tinker.ModelInput` the sampler takes."""
    if isinstance(model_input, tinker.ModelInput):
        return model_input
    if isinstance(model_input, ModelInput):
        return model_input_to_tinker(model_input)
    if isinstance(model_input, (list, tuple, np.ndarray)):
        return tinker.ModelInput.from_ints(ModelInput.from_ints(model_input).to_ints())
    raise TypeError(
        "TinkerTokenCompleter: model_input must be a tinker.ModelInput, an "
        f"rlpure.records.ModelInput or a list of token ids, got {type(model_input).__name__}"
    )


def tokens_with_logprobs_from_sequence(
    sequence: tinker.SampledSequence, *, prompt_cache_hit_tokens: int = 0
) -> TokensWithLogprobs:
    """A `tinker.SampledSequence` → `TokensWithLogprobs` (tokens, logprobs, stop reason).

    The sequence's numpy arrays are used when it has them (`tokens_np`, `logprobs_np`), its
    lists otherwise. `prompt_cache_hit_tokens` is the response's (one per response, so the
    caller passes it).
    """
    tokens = (
        sequence.tokens_np
        if sequence.tokens_np is not None
        else np.asarray(sequence.tokens, np.int64)
    )
    logprobs = sequence.logprobs_np if sequence.logprobs_np is not None else sequence.logprobs
    return TokensWithLogprobs(
        tokens=tokens,
        logprobs=None if logprobs is None else np.asarray(logprobs, np.float32),
        stop_reason=sequence.stop_reason,
        sequence_id=sequence.sequence_id,
        prompt_cache_hit_tokens=prompt_cache_hit_tokens,
    )


class TinkerTokenCompleter:
    """Samples actions from a Tinker-style sampling client, one sample per call.

    The constructor is the cookbook's (`TinkerTokenCompleter(sampling_client, max_tokens,
    temperature=1.0, context_window=None)`, positional or keyword), plus the keyword `seed`.

    Attributes:
        sampling_client: `tinker.SamplingClient`, or any `shell.clients.SamplingClient`.
        max_tokens: cap on sampled tokens per action.
        temperature: sampling temperature (0.0 = greedy).
        context_window: the model's context size; when set, each call's cap is lowered so that
            prompt + sampled tokens fit, and a prompt that fills it is a `ValueError`.
        seed: base seed; call `n` uses `seed + n` (None: the sampler's own randomness).
    """

    def __init__(
        self,
        sampling_client: SamplingClient,
        max_tokens: int,
        temperature: float = 1.0,
        context_window: int | None = None,
        *,
        seed: int | None = None,
    ) -> None:
        if max_tokens < 1:
            raise ValueError(f"TinkerTokenCompleter.max_tokens: expected >= 1, got {max_tokens}")
        if temperature < 0:
            raise ValueError(f"TinkerTokenCompleter.temperature: expected >= 0, got {temperature}")
        if context_window is not None and context_window < 1:
            raise ValueError(
                f"TinkerTokenCompleter.context_window: expected >= 1, got {context_window}"
            )
        self.sampling_client = sampling_client
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.context_window = context_window
        self.seed = seed
        self._calls = 0

    def __repr__(self) -> str:
        return (
            f"TinkerTokenCompleter(max_tokens={self.max_tokens}, temperature={self.temperature}, "
            f"context_window={self.context_window}, seed={self.seed})"
        )

    async def __call__(
        self,
        model_input: ModelInput | tinker.ModelInput | Sequence[int],
        stop: StopCondition,
        *,
        max_tokens: int | None = None,
    ) -> TokensWithLogprobs:
        """Samples one action; `max_tokens` caps this call (the minimum with the completer's)."""
        prompt = _tinker_prompt(model_input)
        cap = self.max_tokens if max_tokens is None else min(self.max_tokens, max_tokens)
        if self.context_window is not None:
            cap = min(cap, self.context_window - prompt.length)
            if cap <= 0:
                raise ValueError(
                    f"Prompt length ({prompt.length}) exceeds context window "
                    f"({self.context_window}). No room for generation."
                )
        seed = None if self.seed is None else self.seed + self._calls
        self._calls += 1
        params = tinker.SamplingParams(
            stop=cast("list[str] | list[int]", list(stop)),
            max_tokens=cap,
            temperature=self.temperature,
            seed=seed,
        )
        response = await self.sampling_client.sample(
            prompt=prompt, num_samples=1, sampling_params=params
        )
        hits = getattr(response, "prompt_cache_hit_tokens", None) or 0
        return tokens_with_logprobs_from_sequence(
            response.sequences[0], prompt_cache_hit_tokens=int(hits)
        )


class TinkerMessageCompleter:
    """Samples assistant messages: renders, samples one sequence, parses it back.

    The constructor is the cookbook's. The renderer may be a `shell.chat` one, the
    cookbook's own, or an `rlpure.render` one.

    Attributes:
        sampling_client: `tinker.SamplingClient`, or any `shell.clients.SamplingClient`.
        renderer: turns messages into a prompt and sampled tokens back into a message.
        max_tokens: cap on sampled tokens per message.
        stop_condition: stop strings or ids (default: the renderer's stop sequences).
        temperature: sampling temperature.
    """

    def __init__(
        self,
        sampling_client: SamplingClient,
        renderer: Any,
        max_tokens: int,
        stop_condition: StopCondition | None = None,
        temperature: float = 1.0,
    ) -> None:
        if max_tokens < 1:
            raise ValueError(f"TinkerMessageCompleter.max_tokens: expected >= 1, got {max_tokens}")
        self.sampling_client = sampling_client
        self.renderer = renderer
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.stop_condition: StopCondition = (
            as_stop_condition(renderer.get_stop_sequences())
            if stop_condition is None
            else as_stop_condition(stop_condition)
        )

    async def __call__(self, messages: list[Message]) -> Message:
        """The next assistant message: `content`, and `tool_calls` when the renderer parsed any."""
        prompt = _tinker_prompt(self.renderer.build_generation_prompt(messages))
        response = await self.sampling_client.sample(
            prompt=prompt,
            num_samples=1,
            sampling_params=tinker.SamplingParams(
                temperature=self.temperature,
                max_tokens=self.max_tokens,
                stop=cast("list[str] | list[int]", list(self.stop_condition)),
            ),
        )
        parsed = self.renderer.parse_response(response.sequences[0].tokens)
        # A cookbook-style `(message, termination)` tuple, or an `rlpure.render.ParsedResponse`.
        parsed_message = parsed[0] if isinstance(parsed, tuple) else parsed.message
        result: Message = {"role": "assistant", "content": parsed_message["content"]}
        if "tool_calls" in parsed_message:
            result["tool_calls"] = parsed_message["tool_calls"]
        return result
