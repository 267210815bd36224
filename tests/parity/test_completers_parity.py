"""`shell.cookbook.completers` against tinker-cookbook 0.6.1's `completers` on the same fake sampler.

Same seed, same calls: the sampler sees the same prompts and sampling parameters (the per-call
`max_tokens` cap, `context_window`), the actions are the same tokens and logprobs, and the
message completers return the same messages.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import tinker

from rlpure.model import ByteTokenizer
from shell.cookbook import completers, renderers
from shell.fakes import FakeSamplingClient

cb_completers = pytest.importorskip("tinker_cookbook.completers", reason="needs tinker-cookbook")
cb_renderers = pytest.importorskip("tinker_cookbook.renderers", reason="needs tinker-cookbook")


def _params(client: FakeSamplingClient) -> list[tuple[list[int], Any, int | None, float]]:
    return [
        (prompt, params.stop, params.max_tokens, params.temperature)
        for prompt, _, params in client.sample_calls
    ]


CASES = [
    # (completer max_tokens, context_window, prompt length, per-call max_tokens)
    (5, None, 3, None),
    (5, None, 3, 2),
    (5, None, 3, 9),
    (8, 10, 7, None),
    (8, 10, 7, 1),
    (8, 10, 2, 20),
]


@pytest.mark.parametrize(("max_tokens", "window", "length", "per_call"), CASES)
def test_token_completers_send_the_same_requests_and_return_the_same_actions(
    max_tokens: int, window: int | None, length: int, per_call: int | None
) -> None:
    ours_client, their_client = FakeSamplingClient(seed=3), FakeSamplingClient(seed=3)
    ours = completers.TinkerTokenCompleter(ours_client, max_tokens, 0.7, window)
    theirs = cb_completers.TinkerTokenCompleter(their_client, max_tokens, 0.7, window)
    prompt = tinker.ModelInput.from_ints(list(range(1, length + 1)))
    for stop in (["\n\nUser:"], [3]):
        mine = asyncio.run(ours(prompt, stop, max_tokens=per_call))
        cookbook = asyncio.run(theirs(prompt, stop, max_tokens=per_call))
        assert mine.tokens.tolist() == cookbook.tokens
        assert mine.maybe_logprobs is not None
        assert mine.maybe_logprobs.tolist() == pytest.approx(cookbook.maybe_logprobs)
        assert (mine.stop_reason, mine.prompt_cache_hit_tokens) == (
            cookbook.stop_reason,
            cookbook.prompt_cache_hit_tokens,
        )
    assert _params(ours_client) == _params(their_client)


def test_a_prompt_filling_the_context_window_is_refused_alike() -> None:
    prompt = tinker.ModelInput.from_ints([1] * 10)
    ours = completers.TinkerTokenCompleter(FakeSamplingClient(), 4, context_window=10)
    theirs = cb_completers.TinkerTokenCompleter(FakeSamplingClient(), 4, context_window=10)
    with pytest.raises(ValueError) as mine:
        asyncio.run(ours(prompt, []))
    with pytest.raises(ValueError) as cookbook:
        asyncio.run(theirs(prompt, []))
    assert str(mine.value) == str(cookbook.value)


@pytest.mark.parametrize("stop_condition", [None, ["!"]])
def test_message_completers_return_the_same_messages(stop_condition: list[str] | None) -> None:
    tokenizer = ByteTokenizer()
    ours_client = FakeSamplingClient(seed=5, vocab_size=128)
    their_client = FakeSamplingClient(seed=5, vocab_size=128)
    ours = completers.TinkerMessageCompleter(
        ours_client, renderers.get_renderer("role_colon", tokenizer), 4, stop_condition, 0.9
    )
    theirs = cb_completers.TinkerMessageCompleter(
        their_client, cb_renderers.get_renderer("role_colon", tokenizer), 4, stop_condition, 0.9
    )
    conversation: list[renderers.Message] = [
        {"role": "system", "content": "terse"},
        {"role": "user", "content": "hi"},
    ]
    for _ in range(3):
        assert asyncio.run(ours(conversation)) == asyncio.run(theirs(conversation))  # type: ignore[arg-type]
    assert _params(ours_client) == _params(their_client)
