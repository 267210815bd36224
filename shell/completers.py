"""Token-level policies over a Tinker-style sampling client, and the SDK call helper.

Conventions:
- A `TokenCompleter` maps an observation (`rlpure.records.ModelInput`) and a stop condition to
  one sampled action (`rlpure.records.TokensWithLogprobs`: int32 tokens, float32 sampling
  logprobs, stop reason). This is the only place where `rlpure` records are converted to and
  from the SDK's `tinker.ModelInput` / `tinker.SampleResponse`.
- The sampling client is a `shell.clients.SamplingClient`: the real `tinker.SamplingClient`,
  the local backend's and `shell.fakes.FakeSamplingClient` all offer the SDK 0.38 call
  `sample(prompt=..., num_samples=..., sampling_params=...)`, which returns an awaitable
  `APIFuture` at once. No retry loop wraps SDK calls here: the SDK retries transient failures
  itself.
- When a `seed` is given, call `n` of the completer samples with `seed + n`, so a run with a
  deterministic scheduler (the local backend) is reproducible while the `G` samples of a group
  still differ.
"""

from __future__ import annotations

from typing import Protocol, cast

import numpy as np
import tinker

from rlpure.records import ModelInput, StopCondition, TokensWithLogprobs
from shell.clients import SamplingClient

__all__ = [
    "TinkerTokenCompleter",
    "TokenCompleter",
    "model_input_from_tinker",
    "model_input_to_tinker",
    "tokens_with_logprobs_from_sequence",
]


class TokenCompleter(Protocol):
    """A policy over tokens: observation and stop condition in, one sampled action out."""

    async def __call__(self, model_input: ModelInput, stop: StopCondition) -> TokensWithLogprobs:
        """Samples one action.

        Args:
            model_input: the observation, int32 tokens `[T_ob]`.
            stop: stop strings or stop token ids.

        Returns:
            The sampled tokens `[T_ac]`, their sampling logprobs `[T_ac]` and stop reason.
        """
        ...


def model_input_to_tinker(model_input: ModelInput) -> tinker.ModelInput:
    """`rlpure.records.ModelInput` → `tinker.ModelInput` (one text chunk)."""
    return tinker.ModelInput.from_ints(model_input.to_ints())


def model_input_from_tinker(model_input: tinker.ModelInput) -> ModelInput:
    """`tinker.ModelInput` (text chunks only) → `rlpure.records.ModelInput`."""
    return ModelInput.from_ints(model_input.to_ints())


def tokens_with_logprobs_from_sequence(sequence: tinker.SampledSequence) -> TokensWithLogprobs:
    """A `tinker.SampledSequence` → `TokensWithLogprobs` (tokens, logprobs, stop reason).

    The sequence's numpy arrays are used when it has them (`tokens_np`, `logprobs_np`), its
    lists otherwise.
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
    )


class TinkerTokenCompleter:
    """Samples actions from a Tinker-style sampling client, one sample per call.

    Attributes:
        sampling_client: `tinker.SamplingClient`, or any `shell.clients.SamplingClient`.
        max_tokens: cap on sampled tokens per action.
        temperature: sampling temperature (0.0 = greedy).
        seed: base seed; call `n` uses `seed + n` (None: the sampler's own randomness).
    """

    def __init__(
        self,
        sampling_client: SamplingClient,
        *,
        max_tokens: int,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> None:
        if max_tokens < 1:
            raise ValueError(f"TinkerTokenCompleter.max_tokens: expected >= 1, got {max_tokens}")
        if temperature < 0:
            raise ValueError(f"TinkerTokenCompleter.temperature: expected >= 0, got {temperature}")
        self.sampling_client = sampling_client
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.seed = seed
        self._calls = 0

    async def __call__(self, model_input: ModelInput, stop: StopCondition) -> TokensWithLogprobs:
        seed = None if self.seed is None else self.seed + self._calls
        self._calls += 1
        params = tinker.SamplingParams(
            stop=cast("list[str] | list[int]", list(stop)),
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            seed=seed,
        )
        response = await self.sampling_client.sample(
            prompt=model_input_to_tinker(model_input),
            num_samples=1,
            sampling_params=params,
        )
        return tokens_with_logprobs_from_sequence(response.sequences[0])
