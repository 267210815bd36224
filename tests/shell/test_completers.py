"""`shell.completion` with the cookbook's signatures: per-call `max_tokens`, `context_window`,
`tinker.ModelInput` observations, the cookbook's constructors, `TinkerMessageCompleter`."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
import tinker

from rlpure.model import ByteTokenizer
from rlpure.records import ModelInput
from shell.completion import (
    TinkerMessageCompleter,
    TinkerTokenCompleter,
    TokenCompleter,
    TokensWithLogprobs,
)
from shell.cookbook import renderers
from shell.fakes import FakeSamplingClient


def test_per_call_max_tokens_is_capped_by_the_completers() -> None:
    client = FakeSamplingClient(vocab_size=7)
    completer = TinkerTokenCompleter(client, 5)  # the cookbook's positional form
    ob = ModelInput.from_ints([1, 2])
    asyncio.run(completer(ob, ["x"], max_tokens=2))
    asyncio.run(completer(ob, ["x"], max_tokens=9))
    asyncio.run(completer(ob, ["x"]))
    assert [params.max_tokens for _, _, params in client.sample_calls] == [2, 5, 5]


def test_context_window_lowers_the_cap_and_refuses_a_full_prompt() -> None:
    client = FakeSamplingClient(vocab_size=7)
    completer = TinkerTokenCompleter(client, max_tokens=8, temperature=1.0, context_window=10)
    asyncio.run(completer(ModelInput.from_ints(list(range(7))), [3]))
    assert client.sample_calls[-1][2].max_tokens == 3
    with pytest.raises(ValueError, match=r"Prompt length \(10\) exceeds context window \(10\)"):
        asyncio.run(completer(ModelInput.from_ints([1] * 10), [3]))
    with pytest.raises(ValueError, match="context_window"):
        TinkerTokenCompleter(client, max_tokens=1, context_window=0)


@pytest.mark.parametrize(
    "ob", [tinker.ModelInput.from_ints([4, 5, 6]), ModelInput.from_ints([4, 5, 6]), [4, 5, 6]]
)
def test_observations_in_every_form_reach_the_sampler(ob: object) -> None:
    client = FakeSamplingClient(vocab_size=7)
    completer = TinkerTokenCompleter(client, max_tokens=2)
    action = asyncio.run(completer(ob, ("\n\nUser:",)))  # type: ignore[arg-type]
    assert isinstance(action, TokensWithLogprobs) and action.maybe_logprobs is not None
    assert client.sample_calls[0][0] == [4, 5, 6]
    with pytest.raises(TypeError, match="model_input must be"):
        asyncio.run(completer("4 5 6", ["x"]))  # type: ignore[arg-type]


def test_a_cookbook_style_subclass_is_a_token_completer() -> None:
    class Echo(TokenCompleter):
        async def __call__(
            self, model_input: ModelInput, stop: object, *, max_tokens: int | None = None
        ) -> TokensWithLogprobs:
            tokens = model_input.to_ints()[: max_tokens or None]
            return TokensWithLogprobs(tokens=tokens, logprobs=[0.0] * len(tokens))

    action = asyncio.run(Echo()(ModelInput.from_ints([1, 2, 3]), (), max_tokens=2))
    assert action.tokens.tolist() == [1, 2]


def test_message_completer_renders_samples_and_parses() -> None:
    client = FakeSamplingClient(vocab_size=200)
    renderer = renderers.get_renderer("role_colon", ByteTokenizer())
    completer = TinkerMessageCompleter(client, renderer, max_tokens=4, temperature=0.5)
    message = asyncio.run(completer([{"role": "user", "content": "hi"}]))
    prompt, _, params = client.sample_calls[0]
    assert prompt == renderer.build_generation_prompt([{"role": "user", "content": "hi"}]).to_ints()
    assert params.stop == ["\n\nUser:"] and params.max_tokens == 4 and params.temperature == 0.5
    assert message["role"] == "assistant" and isinstance(message["content"], str)
    assert set(message) == {"role", "content"}


def test_prompt_cache_hits_are_carried_over() -> None:
    class CachingClient(FakeSamplingClient):
        async def _sample(self, *args: Any, **kwargs: Any) -> tinker.SampleResponse:
            response = await super()._sample(*args, **kwargs)
            return dataclasses.replace(response, prompt_cache_hit_tokens=2)

    action = asyncio.run(TinkerTokenCompleter(CachingClient(), 2)(ModelInput.from_ints([1]), []))
    assert action.prompt_cache_hit_tokens == 2
