"""Tests for `shell.local`: Tinker's client interface over the local JAX model.

Covers the SDK's return conventions with the real `tinker` types, sampler/trainer logprob
agreement, learning under cross-entropy, exact resume from `save_state`, determinism by seed,
stop strings and stop token ids, micro-batching of concurrent requests, datum validation, every
loss, gradient accumulation, the optimiser wiring and the trace-count bound.

All calls stay inside a few shape buckets (≤ 8 sample rows, prompts ≤ 16 tokens, ≤ 16 new
tokens, ≤ 8 datums of ≤ 16 tokens), so the file compiles a handful of times.
"""

from __future__ import annotations

import asyncio
import doctest
import json
from pathlib import Path
from typing import Any

import jax
import msgspec
import numpy as np
import pytest
import tinker
from tinker import types

from rlpure import model as model_lib
from rlpure.model import EOS_ID, ByteTokenizer
from shell.errors import CheckpointError, ConfigError
from shell.local import LocalSamplingClient, LocalServiceClient, LocalTrainingClient
from shell.local import _inputs as local_inputs
from shell.local import _sampling as local_sampling
from shell.local._train_steps import (
    loss_and_logprob_grad,
    merge_metrics,
    model_backward,
    model_forward_vjp,
)
from tests.compile_count import count_compiles

MODEL = "rlpure/tiny"
TOK = ByteTokenizer()


def _trainer(seed: int = 0, tmp_path: Path | None = None) -> LocalTrainingClient:
    service = LocalServiceClient(seed=seed, checkpoint_dir=tmp_path)
    return service.create_lora_training_client(base_model=MODEL, rank=8).result()


def _prompt(text: str) -> types.ModelInput:
    return types.ModelInput.from_ints(TOK.encode(text))


def _td(values: Any, dtype: Any = np.float32) -> types.TensorData:
    return types.TensorData.from_numpy(np.asarray(values, dtype))


def _lps(seq: types.SampledSequence) -> list[float]:
    assert seq.logprobs is not None
    return seq.logprobs


def _sft_datum(text: str, n_prompt: int = 2) -> types.Datum:
    seq = TOK.encode(text)
    n = len(seq) - 1
    weights = np.r_[np.zeros(n_prompt), np.ones(n - n_prompt)]
    return types.Datum(
        model_input=types.ModelInput.from_ints(seq[:-1]),
        loss_fn_inputs={"target_tokens": _td(seq[1:], np.int64), "weights": _td(weights)},
    )


def _rl_datum(
    prompt: list[int], tokens: list[int], logprobs: list[float], advantage: float
) -> types.Datum:
    seq = prompt + tokens
    n_prompt = len(prompt) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(seq[:-1]),
        loss_fn_inputs={
            "target_tokens": _td(seq[1:], np.int64),
            "logprobs": _td([0.0] * n_prompt + logprobs),
            "advantages": _td([0.0] * n_prompt + [advantage] * len(tokens)),
        },
    )


def _params_equal(a: Any, b: Any) -> bool:
    return all(
        np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True)
    )


TEXTS = ["ab=1", "cd=22", "ef=333", "gh=4444", "ij=5", "kl=66", "mn=777", "op=8888"]
SP16 = types.SamplingParams(max_tokens=16, temperature=1.0, stop=[])
# Short enough that prompt + completion stays in the 16-token training bucket.
SP10 = types.SamplingParams(max_tokens=10, temperature=1.0, stop=[])


# --- the SDK's shapes and conventions ---------------------------------------------------------


def test_async_api_mirrors_the_sdk_with_real_tinker_types() -> None:
    async def main() -> None:
        service = LocalServiceClient(seed=0)
        trainer = await service.create_lora_training_client_async(base_model=MODEL, rank=4)
        assert isinstance(trainer, LocalTrainingClient)
        assert isinstance(
            await service.create_lora_training_client(base_model=MODEL), LocalTrainingClient
        )
        assert trainer.get_tokenizer().decode(trainer.get_tokenizer().encode("x")) == "<|bos|>x"
        assert trainer.get_info().model_data.model_name == MODEL

        fb = await trainer.forward_backward_async([_sft_datum("hi=1")], loss_fn="cross_entropy")
        assert isinstance(fb, tinker.APIFuture)
        out = await fb.result_async()
        assert isinstance(out, types.ForwardBackwardOutput)
        assert out is fb.result() and out is fb.future().result() and out is await fb
        (output,) = out.loss_fn_outputs
        assert isinstance(output["logprobs"], types.TensorData)
        assert output["logprobs"].to_numpy().shape == (len(TOK.encode("hi=1")) - 1,)
        assert out.metrics["loss:sum"] > 0

        step = await trainer.optim_step_async(types.AdamParams(learning_rate=1e-3))
        assert isinstance(await step.result_async(), types.OptimStepResponse)

        sampler = await trainer.save_weights_and_get_sampling_client_async()
        assert isinstance(sampler, LocalSamplingClient)
        response = await sampler.sample_async(
            prompt=_prompt("q"), num_samples=3, sampling_params=SP16
        )
        assert isinstance(response, types.SampleResponse) and len(response.sequences) == 3
        for seq in response.sequences:
            assert isinstance(seq, types.SampledSequence)
            assert seq.stop_reason == "length" and len(seq.tokens) == 16
            assert seq.logprobs is not None and len(seq.logprobs) == 16
        future = sampler.sample(_prompt("q"), 1, SP16)
        assert isinstance(future, tinker.APIFuture)
        assert isinstance(await future, types.SampleResponse)
        # The deprecated direct use of the client future still works, as in the SDK.
        assert trainer.save_weights_and_get_sampling_client().get_base_model() == MODEL

    asyncio.run(main())


def test_sync_api_and_service_helpers() -> None:
    service = LocalServiceClient(seed=0)
    names = [m.model_name for m in service.get_server_capabilities().supported_models]
    assert MODEL in names
    trainer = service.create_lora_training_client(base_model=MODEL).result()
    sampler = trainer.save_weights_and_get_sampling_client().result()
    response = sampler.sample(_prompt("q"), 2, SP16).result()
    assert len(response.sequences) == 2
    # Every client of a service starts from the same base weights (as LoRA on one base).
    second = service.create_lora_training_client(base_model=MODEL).result()
    assert _params_equal(second.params, trainer.params)
    assert not _params_equal(
        service.create_lora_training_client(base_model=MODEL, seed=1).result().params,
        trainer.params,
    )
    base = service.create_sampling_client(base_model=MODEL).result()
    seeded = types.SamplingParams(max_tokens=16, seed=2, stop=[])
    assert (
        base.sample(_prompt("q"), 1, seeded).result().sequences[0].tokens
        == sampler.sample(_prompt("q"), 1, seeded).result().sequences[0].tokens
    )
    with pytest.raises(ConfigError, match="Available: toy models"):
        service.create_lora_training_client(base_model="Qwen/Qwen3-8B")
    with pytest.raises(NotImplementedError, match="AdamParams"):
        trainer.optim_step(types.DimuonParams(learning_rate=0.1))  # type: ignore[arg-type]


# --- sampling ---------------------------------------------------------------------------------


def test_sampler_logprobs_equal_training_logprobs_on_policy() -> None:
    trainer = _trainer()
    sampler = trainer.save_weights_and_get_sampling_client().result()
    data, sampled = [], []
    for text in ("1+1=", "22+3=", "x"):
        prompt = TOK.encode(text)
        response = sampler.sample(
            types.ModelInput.from_ints(prompt), 2, SP10, include_prompt_logprobs=True
        ).result()
        computed = sampler.compute_logprobs(types.ModelInput.from_ints(prompt)).result()
        prompt_logprobs = response.prompt_logprobs
        assert prompt_logprobs is not None
        assert computed[0] is None and prompt_logprobs[0] is None
        np.testing.assert_allclose(
            np.asarray(computed[1:], float), np.asarray(prompt_logprobs[1:], float), atol=1e-6
        )
        for seq in response.sequences:
            data.append(_rl_datum(prompt, seq.tokens, _lps(seq), 1.0))
            sampled.append((len(prompt) - 1, np.asarray(seq.logprobs)))
    out = trainer.forward(data, "importance_sampling").result()
    for output, (start, logprobs) in zip(out.loss_fn_outputs, sampled, strict=True):
        np.testing.assert_allclose(output["logprobs"].to_numpy()[start:], logprobs, atol=1e-5)
    assert out.metrics["ratio:min"] == pytest.approx(1.0, abs=1e-4)
    assert out.metrics["ratio:max"] == pytest.approx(1.0, abs=1e-4)


def _valid_utf8_window(tokens: list[int]) -> str:
    """The text of the longest window (≤ 3 tokens, not at the start) that is valid UTF-8."""
    for width in (3, 2, 1):
        for start in range(2, len(tokens) - width + 1):
            window = tokens[start : start + width]
            if all(t < 256 for t in window):
                try:
                    return bytes(window).decode("utf-8")
                except UnicodeDecodeError:
                    continue
    raise AssertionError(f"no valid UTF-8 window in {tokens}")


def test_stop_strings_and_stop_token_ids_are_honoured_and_included() -> None:
    sampler = _trainer().save_weights_and_get_sampling_client().result()
    greedy = types.SamplingParams(max_tokens=16, temperature=0.0, stop=[])
    free = sampler.sample(_prompt("stop test"), 1, greedy).result().sequences[0]
    assert free.stop_reason == "length" and len(free.tokens) == 16
    # A stop token id: generation ends after its first occurrence, which is included.
    token = free.tokens[5]
    cut = free.tokens.index(token) + 1
    params = types.SamplingParams(max_tokens=16, temperature=0.0, stop=[token])
    seq = sampler.sample(_prompt("stop test"), 1, params).result().sequences[0]
    assert seq.tokens == free.tokens[:cut] and seq.stop_reason == "stop"
    # A stop string: generation ends once the decoded tail contains it, string included.
    stop_text = _valid_utf8_window(free.tokens)
    stop_ids = TOK.encode(stop_text, add_special_tokens=False)
    end = next(
        i + len(stop_ids) for i in range(16) if free.tokens[i : i + len(stop_ids)] == stop_ids
    )
    params = types.SamplingParams(max_tokens=16, temperature=0.0, stop=[stop_text, "\x00\x01"])
    seq = sampler.sample(_prompt("stop test"), 1, params).result().sequences[0]
    assert seq.tokens == free.tokens[:end] and seq.stop_reason == "stop"
    assert TOK.decode(seq.tokens).endswith(stop_text)
    # A single string is accepted like a one-element list.
    params = types.SamplingParams(max_tokens=16, temperature=0.0, stop=stop_text)
    assert (
        sampler.sample(_prompt("stop test"), 1, params).result().sequences[0].tokens == seq.tokens
    )
    # Stop rules: None → EOS; [] → none; a non-empty list → the list plus EOS.
    request = sampler._make_request(
        _prompt("a"), 1, types.SamplingParams(max_tokens=4), include_prompt_logprobs=False
    )
    assert request.stop_token_ids == (EOS_ID,)
    request = sampler._make_request(
        _prompt("a"), 1, types.SamplingParams(max_tokens=4, stop=[]), include_prompt_logprobs=False
    )
    assert request.stop_token_ids == () and request.stop_sequences == ()
    request = sampler._make_request(
        _prompt("a"),
        1,
        types.SamplingParams(max_tokens=4, stop=["ab"]),
        include_prompt_logprobs=False,
    )
    assert request.stop_token_ids == (EOS_ID,) and request.stop_sequences == ((97, 98),)


def test_seeded_sampling_is_reproducible_and_temperature_zero_is_greedy() -> None:
    sampler = _trainer().save_weights_and_get_sampling_client().result()
    seeded = types.SamplingParams(max_tokens=16, temperature=1.0, seed=7, stop=[])
    first = sampler.sample(_prompt("s"), 2, seeded).result()
    second = sampler.sample(_prompt("s"), 2, seeded).result()
    assert [s.tokens for s in first.sequences] == [s.tokens for s in second.sequences]
    assert first.sequences[0].tokens != first.sequences[1].tokens  # samples differ within a call
    unseeded = [
        sampler.sample(_prompt("s"), 1, SP16).result().sequences[0].tokens for _ in range(2)
    ]
    assert unseeded[0] != unseeded[1]  # successive unseeded requests draw fresh randomness
    greedy = types.SamplingParams(max_tokens=16, temperature=0.0, seed=1, stop=[])
    greedy_other = types.SamplingParams(max_tokens=16, temperature=0.0, seed=2, stop=[])
    a = sampler.sample(_prompt("s"), 2, greedy).result().sequences
    b = sampler.sample(_prompt("s"), 1, greedy_other).result().sequences
    assert a[0].tokens == a[1].tokens == b[0].tokens


async def _gather_samples(
    sampler: Any, requests: list[tuple[types.ModelInput, int, types.SamplingParams]]
) -> list[types.SampleResponse]:
    """`(prompt, num_samples, params)` requests submitted together (one tick)."""
    return await asyncio.gather(
        *[
            sampler.sample_async(prompt=p, num_samples=n, sampling_params=sp)
            for p, n, sp in requests
        ]
    )


@pytest.fixture
def sampled_batches(monkeypatch: pytest.MonkeyPatch) -> list[model_lib.SampleBatch]:
    """The `SampleBatch` of every `rlpure.model.sample_tokens` call the test makes, in order."""
    batches: list[model_lib.SampleBatch] = []
    real = model_lib.sample_tokens

    def recording(*args: Any, **kwargs: Any) -> Any:
        batches.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(model_lib, "sample_tokens", recording)
    return batches


def test_concurrent_requests_are_served_in_one_batched_call(
    sampled_batches: list[model_lib.SampleBatch],
) -> None:
    sampler = _trainer().save_weights_and_get_sampling_client().result()
    prompts = [_prompt(t) for t in ("a", "bb", "ccc", "dddd")]
    params = [
        types.SamplingParams(max_tokens=16, temperature=1.0, seed=i, stop=[]) for i in range(4)
    ]
    alone = [sampler.sample(p, 2, sp).result() for p, sp in zip(prompts, params, strict=True)]
    calls = sampled_batches
    calls.clear()

    async def main() -> list[types.SampleResponse]:
        async def one(p: types.ModelInput, sp: types.SamplingParams) -> types.SampleResponse:
            await asyncio.sleep(0)  # requests need not arrive in the very same tick
            return await sampler.sample_async(prompt=p, num_samples=2, sampling_params=sp)

        return await asyncio.gather(*[one(p, sp) for p, sp in zip(prompts, params, strict=True)])

    batched = asyncio.run(main())
    # one call: 8 sample rows over 4 prompts, each prefilled once for its 2 samples, whose
    # cache both read (a grid of 4 prompts × 2 rows)
    assert len(calls) == 1 and calls[0].prompt_tokens_B_T.shape[0] == 4
    assert calls[0].max_new_tokens_B.shape == (8,)
    assert calls[0].rows_per_prompt == 2 and calls[0].prompt_index_B is None
    for x, y in zip(alone, batched, strict=True):
        assert [s.tokens for s in x.sequences] == [s.tokens for s in y.sequences]
        for s, t in zip(x.sequences, y.sequences, strict=True):
            np.testing.assert_allclose(_lps(s), _lps(t), atol=1e-6)

    # 3 + 1 + 1 + 1 samples: a grid would take 4 × 3 rows, the flat layout 8, so rows copy
    # their prompt's cache (`prompt_index_B`); each request alone samples the same tokens
    counts = [3, 1, 1, 1]
    calls.clear()
    uneven = asyncio.run(_gather_samples(sampler, list(zip(prompts, counts, params, strict=True))))
    assert len(calls) == 1 and calls[0].rows_per_prompt == 1
    assert np.asarray(calls[0].prompt_index_B).tolist() == [0, 0, 0, 1, 2, 3, 0, 0]
    for p, n, sp, y in zip(prompts, counts, params, uneven, strict=True):
        x = sampler.sample(p, n, sp).result()
        assert [s.tokens for s in x.sequences] == [s.tokens for s in y.sequences]
        for s, t in zip(x.sequences, y.sequences, strict=True):
            np.testing.assert_allclose(_lps(s), _lps(t), atol=1e-6)

    # a group sent as one request per sample (the cookbook's rollouts): 2 requests of 1 sample
    # for each of 4 prompts, interleaved, are 4 prefills on a grid of 4 × 2, not 8 prefills;
    # each request alone samples the same tokens
    single = [
        (p, 1, types.SamplingParams(max_tokens=16, temperature=1.0, seed=10 * i + k, stop=[]))
        for k in range(2)
        for i, p in enumerate(prompts)
    ]
    calls.clear()
    singles = asyncio.run(_gather_samples(sampler, single))
    assert len(calls) == 1 and calls[0].prompt_tokens_B_T.shape[0] == 4
    assert calls[0].rows_per_prompt == 2 and calls[0].prompt_index_B is None
    for (p, n, sp), y in zip(single, singles, strict=True):
        x = sampler.sample(p, n, sp).result()
        assert [s.tokens for s in x.sequences] == [s.tokens for s in y.sequences]
        for s, t in zip(x.sequences, y.sequences, strict=True):
            np.testing.assert_allclose(_lps(s), _lps(t), atol=1e-6)

    async def blocking_result() -> types.SampleResponse:
        return sampler.sample(prompts[0], 2, params[0]).result()  # flushes, no deadlock

    assert [s.tokens for s in asyncio.run(blocking_result()).sequences] == [
        s.tokens for s in alone[0].sequences
    ]


def test_sampling_requests_are_validated_at_submission() -> None:
    sampler = _trainer().save_weights_and_get_sampling_client().result()
    with pytest.raises(ValueError, match="context length"):
        sampler.sample(_prompt("a"), 1, types.SamplingParams(max_tokens=5000)).result()
    with pytest.raises(ValueError, match="num_samples"):
        sampler.sample(_prompt("a"), 0, SP16)
    with pytest.raises(TypeError, match="SamplingParams"):
        sampler.sample(_prompt("a"), 1, {"max_tokens": 3})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="temperature"):
        sampler.sample(_prompt("a"), 1, types.SamplingParams(max_tokens=3, temperature=-1.0))
    with pytest.raises(ValueError, match="empty prompt"):
        sampler.sample(types.ModelInput.empty(), 1, SP16)
    with pytest.raises(ValueError, match="outside"):
        sampler.sample(types.ModelInput.from_ints([999]), 1, SP16)
    for option in ("topk_sample_logprobs", "prompt_alt_tokens_k"):
        negative: dict[str, Any] = {option: -1}
        with pytest.raises(ValueError, match=rf"sample\.{option}: expected a whole"):
            sampler.sample(_prompt("a"), 1, SP16, **negative)


def test_a_bad_request_fails_alone_and_never_the_tick_it_would_join() -> None:
    sampler = _trainer().save_weights_and_get_sampling_client().result()
    prompt = _prompt("hello world")
    n = len(prompt.to_ints())
    with pytest.raises(
        ValueError, match=r"prompt_logprobs_last_n: expected a whole number in \[1, "
    ):
        sampler.compute_logprobs(prompt, 2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"compute_logprobs\.prompt: empty prompt"):
        sampler.compute_logprobs(types.ModelInput.empty())
    with pytest.raises(ValueError, match=r"sample.prompt_logprobs_last_n: expected .* got 0"):
        sampler.sample(prompt, 1, SP16, include_prompt_logprobs=True, prompt_logprobs_last_n=0)
    huge = types.SamplingParams(max_tokens=4, seed=3, top_k=2**31)
    unfiltered = types.SamplingParams(max_tokens=4, seed=3, top_k=-1)

    async def tick() -> list[Any]:
        return list(
            await asyncio.gather(
                sampler.compute_logprobs(prompt),
                sampler.compute_logprobs(prompt, 2.0),  # type: ignore[arg-type]  # the SDK's model makes it 2
                sampler.compute_logprobs(prompt),
                sampler.sample(prompt, 1, SP16),
                sampler.sample(
                    prompt,
                    1,
                    SP16,
                    include_prompt_logprobs=True,
                    prompt_logprobs_last_n=2.0,  # type: ignore[arg-type]
                ),
                sampler.sample(prompt, 2, huge),
                sampler.sample(prompt, 2, unfiltered),
            )
        )

    whole, last_two, again, plain, with_last, big_k, no_k = asyncio.run(tick())
    assert whole == again and len(whole) == n
    assert last_two == [None] * (n - 2) + whole[-2:]
    assert len(plain.sequences) == 1 and with_last.prompt_logprobs == last_two
    assert [s.tokens for s in big_k.sequences] == [s.tokens for s in no_k.sequences]


def test_topk_prompt_logprobs_are_the_most_likely_next_tokens_and_their_logprobs() -> None:
    sampler = _trainer().save_weights_and_get_sampling_client().result()
    prompt = _prompt("count: 1 2 3 4")
    tokens = prompt.to_ints()
    n, k = len(tokens), 4

    async def tick() -> list[types.SampleResponse]:
        return list(
            await asyncio.gather(
                sampler.sample(
                    prompt, 1, SP16, include_prompt_logprobs=True, topk_prompt_logprobs=k
                ),
                sampler.sample(_prompt("ab"), 1, SP16, topk_prompt_logprobs=2.0),  # type: ignore[arg-type]
                sampler.sample(
                    prompt,
                    2,
                    SP16,
                    include_prompt_logprobs=True,
                    topk_prompt_logprobs=k,
                    prompt_logprobs_last_n=3,
                ),
                sampler.sample(prompt, 1, SP16),
            )
        )

    full, short, last_three, plain = asyncio.run(tick())
    topk = full.topk_prompt_logprobs
    assert topk is not None and len(topk) == n and topk[0] is None
    for i in range(1, n):
        entries = topk[i]
        assert entries is not None and len(entries) == k
        values = [lp for _, lp in entries]
        assert values == sorted(values, reverse=True)
        for candidate, lp in entries[:2]:  # what scoring the prefix plus that token gives
            scored = sampler.compute_logprobs(types.ModelInput.from_ints([*tokens[:i], candidate]))
            assert abs((scored.result()[-1] or np.nan) - lp) < 1e-5
        if tokens[i] in dict(entries):  # the prompt's own token where it ranks
            assert full.prompt_logprobs is not None
            assert abs(dict(entries)[tokens[i]] - (full.prompt_logprobs[i] or np.nan)) < 1e-5
    short_topk = short.topk_prompt_logprobs
    assert short_topk is not None and short_topk[0] is None and len(short_topk[1] or []) == 2
    assert last_three.topk_prompt_logprobs == [None] * (n - 3) + topk[n - 3 :]
    assert len(last_three.sequences) == 2
    assert plain.topk_prompt_logprobs is None and plain.topk_prompt_logprobs_np is None
    for bad in (-1, 1.5, model_lib.VOCAB_SIZE + 1, True):
        with pytest.raises(ValueError, match=r"sample\.topk_prompt_logprobs: expected a whole"):
            sampler.sample(prompt, 1, SP16, topk_prompt_logprobs=bad)  # type: ignore[arg-type]
    assert doctest.testmod(local_sampling).failed == 0
    assert doctest.testmod(local_inputs).failed == 0  # dense_from_csr


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_topk_sample_logprobs_rank_the_tempered_distribution_each_token_came_from(
    temperature: float,
) -> None:
    sampler = _trainer().save_weights_and_get_sampling_client().result()
    prompt = _prompt("count: 1 2")
    params = types.SamplingParams(max_tokens=8, temperature=temperature, seed=3, stop=[])
    k, v = 5, model_lib.VOCAB_SIZE
    ranked = sampler.sample(prompt, 3, params, topk_sample_logprobs=k).result()
    whole = sampler.sample(prompt, 1, params, topk_sample_logprobs=v).result()
    plain = sampler.sample(prompt, 3, params).result()
    assert plain.sequences[0].topk_logprobs is None
    for seq, same in zip(ranked.sequences, plain.sequences, strict=True):
        assert seq.tokens == same.tokens and seq.logprobs == same.logprobs  # the option only adds
        topk, lps = seq.topk_logprobs, _lps(seq)
        assert topk is not None and len(topk) == len(seq.tokens)
        for i, (token, entries) in enumerate(zip(seq.tokens, topk, strict=True)):
            assert entries is not None and len(entries) == k
            values = [lp for _, lp in entries]
            assert values == sorted(values, reverse=True) and values[0] <= 0
            if token in dict(entries):  # the sampled token where it ranks: its reported logprob
                assert abs(dict(entries)[token] - lps[i]) < 1e-4
            if temperature == 0:
                assert entries[0][0] == token  # greedy: the most likely token
    # The whole vocabulary: log_softmax(untempered / T) at each position (untempered at T = 0),
    # the untempered distribution read as prompt top-k logprobs of prompt + completion.
    (seq,) = whole.sequences
    assert seq.topk_logprobs is not None
    tokens = prompt.to_ints() + seq.tokens
    scored = sampler.sample(
        types.ModelInput.from_ints(tokens), 1, params, topk_prompt_logprobs=v
    ).result()
    assert scored.topk_prompt_logprobs is not None
    t = temperature or 1.0
    for i, entries in enumerate(seq.topk_logprobs):
        untempered = scored.topk_prompt_logprobs[len(prompt.to_ints()) + i]
        assert entries is not None and untempered is not None
        want = np.zeros(v)
        for token, lp in untempered:
            want[token] = lp / t
        want -= np.log(np.exp(want - want.max()).sum()) + want.max()
        got = np.zeros(v)
        for token, lp in entries:
            got[token] = lp
        np.testing.assert_allclose(got, want, atol=1e-4)


def _tempered_rows(sampler: Any, tokens: list[int], temperature: float) -> np.ndarray:
    """float64 `[len(tokens) − 1, V]`: log_softmax(untempered / T) after each `tokens[: i + 1]`
    (untempered at T = 0), read from the whole-vocabulary top-k prompt logprobs."""
    v = model_lib.VOCAB_SIZE
    params = types.SamplingParams(max_tokens=1, seed=0)
    scored = sampler.sample(
        types.ModelInput.from_ints(tokens), 1, params, topk_prompt_logprobs=v
    ).result()
    rows = np.zeros((len(tokens) - 1, v))
    for i, entries in enumerate(scored.topk_prompt_logprobs[1:]):
        for token, lp in entries:
            rows[i, token] = lp / (temperature or 1.0)
    return rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))


@pytest.mark.parametrize("temperature", [1.0, 0.5, 0.0])
def test_prompt_alt_tokens_are_seeded_draws_from_each_prompt_position(temperature: float) -> None:
    sampler = _trainer().save_weights_and_get_sampling_client().result()
    prompt = _prompt("count: 1 2 3")
    tokens, k = prompt.to_ints(), 2048
    params = types.SamplingParams(max_tokens=4, temperature=temperature, seed=11, stop=[])
    drawn = sampler.sample(prompt, 2, params, prompt_alt_tokens_k=k).result()
    plain = sampler.sample(prompt, 2, params).result()
    assert plain.prompt_alt_tokens is None
    for a, b in zip(drawn.sequences, plain.sequences, strict=True):  # a stream of their own
        assert a.tokens == b.tokens and a.logprobs == b.logprobs
    alt = drawn.prompt_alt_tokens
    assert alt is not None
    ids, lps = alt.tokens.to_numpy(), alt.logprobs.to_numpy()
    assert ids.shape == lps.shape == (len(tokens) - 1, k) and ids.dtype == np.int64
    again = sampler.sample(prompt, 1, params, prompt_alt_tokens_k=k).result().prompt_alt_tokens
    assert again is not None and np.array_equal(again.tokens.to_numpy(), ids)  # seeded
    rows = _tempered_rows(sampler, tokens, temperature)
    np.testing.assert_allclose(lps, np.take_along_axis(rows, ids, axis=1), atol=1e-4)
    if temperature == 0:  # greedy: every draw the most likely token
        assert np.array_equal(ids, np.broadcast_to(rows.argmax(axis=1)[:, None], ids.shape))
        return
    other = types.SamplingParams(max_tokens=4, temperature=temperature, seed=12, stop=[])
    reseeded = sampler.sample(prompt, 1, other, prompt_alt_tokens_k=k).result().prompt_alt_tokens
    assert reseeded is not None and not np.array_equal(reseeded.tokens.to_numpy(), ids)
    # Drawn from p: the draws' mean logprob is −H(p) within four standard errors (uniform
    # draws, or draws at another temperature, land far outside).
    p = np.exp(rows)
    mean, spread = (
        (p * rows).sum(axis=1),
        np.sqrt((p * rows**2).sum(axis=1) - (p * rows).sum(axis=1) ** 2),
    )
    z = (lps.mean(axis=1) - mean) / (spread / np.sqrt(k))
    assert np.all(np.abs(z) < 4), z


def test_target_prompt_logprobs_score_the_ids_asked_for_dense_or_sparse() -> None:
    sampler = _trainer().save_weights_and_get_sampling_client().result()
    tokens = list(b"score these")
    prompt, n = types.ModelInput.from_ints(tokens), len(tokens)
    ids = np.full((n - 1, 3), -1, np.int64)  # cell [i, j] is scored after tokens[: i + 1]
    ids[0] = [tokens[1], 7, 250]
    ids[5, 2] = tokens[6]
    ids[n - 2, 0] = 0
    cells = [(0, 0), (0, 1), (0, 2), (5, 2), (n - 2, 0)]
    sparse = types.TensorData(  # the same cells in CSR form, as TensorData.from_torch_sparse makes
        data=[int(ids[i, j]) for i, j in cells],
        dtype="int64",
        shape=[n - 1, 3],
        sparse_crow_indices=[0, 3, 3, 3, 3, 3, 4, 4, 4, 4, 5],
        sparse_col_indices=[0, 1, 2, 2, 0],
    )
    params = types.SamplingParams(max_tokens=2, seed=1)

    async def tick() -> list[types.SampleResponse]:
        return list(
            await asyncio.gather(
                sampler.sample(prompt, 1, params, include_prompt_logprobs=True,
                               target_prompt_logprobs=types.TensorData.from_numpy(ids)),
                sampler.sample(prompt, 2, params, target_prompt_logprobs=sparse),
                sampler.sample(prompt, 1, params),
            )
        )  # fmt: skip

    dense_out, sparse_out, plain = asyncio.run(tick())
    assert dense_out.target_prompt_logprobs is not None and plain.target_prompt_logprobs is None
    got = dense_out.target_prompt_logprobs.to_numpy()
    assert got.shape == (n - 1, 3) and got.dtype == np.float32
    assert np.all(got[ids == -1] == 0.0)
    for i, j in cells:  # what scoring the prefix plus that id gives
        scored = sampler.compute_logprobs(
            types.ModelInput.from_ints([*tokens[: i + 1], int(ids[i, j])])
        )
        assert abs((scored.result()[-1] or np.nan) - got[i, j]) < 1e-5
    assert dense_out.prompt_logprobs is not None  # the prompt's own next token, both ways
    assert abs(got[0, 0] - (dense_out.prompt_logprobs[1] or np.nan)) < 1e-5
    back = sparse_out.target_prompt_logprobs
    assert back is not None and len(sparse_out.sequences) == 2
    assert back.sparse_crow_indices == sparse.sparse_crow_indices
    assert back.sparse_col_indices == sparse.sparse_col_indices
    assert back.data == [float(got[i, j]) for i, j in cells]
    for bad, message in (
        (types.TensorData.from_numpy(ids[:-1]), r"shape \[len\(prompt\) - 1, K\]"),
        (types.TensorData.from_numpy(ids.astype(np.float32)), "expected int64 token ids"),
        (types.TensorData.from_numpy(np.where(ids == 7, 9999, ids)), "id 9999 at \\[0, 1\\]"),
        (types.TensorData.from_numpy(np.where(ids == 7, -2, ids)), "id -2 at \\[0, 1\\]"),
        (
            types.TensorData(data=[1], dtype="int64", shape=[n - 1, 3],
                             sparse_crow_indices=[0, 2], sparse_col_indices=[0]),
            "inconsistent sparse CSR",
        ),
        (  # row pointers that go back: refused by name, not by numpy
            types.TensorData(data=[1, 2], dtype="int64", shape=[n - 1, 3],
                             sparse_crow_indices=[0, 2, 1, *[2] * (n - 3)],
                             sparse_col_indices=[0, 1]),
            "inconsistent sparse CSR",
        ),
    ):  # fmt: skip
        with pytest.raises((TypeError, ValueError), match=message):
            sampler.sample(prompt, 1, params, target_prompt_logprobs=bad)


# --- training ---------------------------------------------------------------------------------


def test_cross_entropy_loss_decreases_on_a_tiny_supervised_problem() -> None:
    trainer = _trainer()
    data = [_sft_datum(text) for text in TEXTS]
    losses = []
    for _ in range(12):
        fb = trainer.forward_backward(data, "cross_entropy")
        trainer.optim_step(types.AdamParams(learning_rate=3e-3)).result()
        losses.append(fb.result().metrics["loss:sum"])
    assert losses[-1] < 0.5 * losses[0]
    assert all(np.isfinite(losses))


def test_save_state_then_load_reproduces_the_next_step_exactly(tmp_path: Path) -> None:
    data = [_sft_datum(text) for text in TEXTS[:5]]
    adam = types.AdamParams(learning_rate=1e-3, weight_decay=0.01, grad_clip_norm=1.0)
    trainer = _trainer(tmp_path=tmp_path)
    trainer.forward_backward(data, "cross_entropy")
    trainer.optim_step(adam)
    path = trainer.save_state("step1").result().path
    trainer.forward_backward(data, "cross_entropy")
    trainer.optim_step(adam)
    expected = trainer.params

    manifest = json.loads((Path(path) / "manifest.json").read_text())
    assert manifest["has_optimizer"] and manifest["base_model"] == MODEL
    with np.load(Path(path) / "arrays.npz", allow_pickle=False) as npz:
        assert any(name.startswith("optimizer/") for name in npz.files)

    service = LocalServiceClient(seed=99, checkpoint_dir=tmp_path)
    resumed = service.create_training_client_from_state_with_optimizer(path).result()
    resumed.forward_backward(data, "cross_entropy")
    resumed.optim_step(adam)
    assert _params_equal(resumed.params, expected)

    other = _trainer(seed=5)
    other.load_state_with_optimizer(path).result()
    other.forward_backward(data, "cross_entropy")
    other.optim_step(adam)
    assert _params_equal(other.params, expected)

    weights_only = service.create_training_client_from_state(path).result()
    weights_only.forward_backward(data, "cross_entropy")
    weights_only.optim_step(adam)
    assert not _params_equal(weights_only.params, expected)  # fresh Adam state differs

    with pytest.raises(FileExistsError):
        trainer.save_state("step1")
    sampler_path = trainer.save_weights_for_sampler("s1").result().path
    with pytest.raises(CheckpointError, match="no optimizer state"):
        service.create_training_client_from_state_with_optimizer(sampler_path)
    seeded = types.SamplingParams(max_tokens=16, seed=3, stop=[])
    from_disk = service.create_sampling_client(model_path=sampler_path).result()
    snapshot = trainer.save_weights_and_get_sampling_client().result()
    assert (
        from_disk.sample(_prompt("z"), 2, seeded).result().sequences[1].tokens
        == snapshot.sample(_prompt("z"), 2, seeded).result().sequences[1].tokens
    )
    with pytest.raises(ValueError, match="file name"):
        trainer.save_state("../escape")


def _short_run(seed: int) -> tuple[list[list[int]], np.ndarray]:
    trainer = _trainer(seed)
    sampler = trainer.save_weights_and_get_sampling_client().result()
    data, tokens = [], []
    for text in ("1+2=", "3+4="):
        prompt = TOK.encode(text)
        for i, seq in enumerate(
            sampler.sample(types.ModelInput.from_ints(prompt), 2, SP10).result().sequences
        ):
            data.append(_rl_datum(prompt, seq.tokens, _lps(seq), 1.0 if i else -1.0))
            tokens.append(seq.tokens)
    trainer.forward_backward(data, "importance_sampling")
    trainer.optim_step(types.AdamParams(learning_rate=1e-3))
    sampler = trainer.save_weights_and_get_sampling_client().result()
    tokens.extend(s.tokens for s in sampler.sample(_prompt("5+6="), 2, SP16).result().sequences)
    return tokens, np.asarray(trainer.params["unembed_E_V"])


def test_same_seed_gives_an_identical_run_and_another_seed_does_not() -> None:
    tokens_a, weights_a = _short_run(0)
    tokens_b, weights_b = _short_run(0)
    tokens_c, weights_c = _short_run(1)
    assert tokens_a == tokens_b and np.array_equal(weights_a, weights_b)
    assert tokens_a != tokens_c and not np.array_equal(weights_a, weights_c)


def test_every_loss_runs_and_gradients_accumulate_until_optim_step() -> None:
    prompt = TOK.encode("p=")
    rng = np.random.default_rng(0)
    data = []
    for i in range(6):
        tokens = rng.integers(0, 256, 5).tolist()
        datum = _rl_datum(prompt, tokens, rng.uniform(-6, -4, 5).tolist(), float(i % 3 - 1))
        inputs = dict(datum.loss_fn_inputs)
        inputs["sequence_ratio_mask"] = _td(np.ones(len(prompt) + 4))
        data.append(types.Datum(model_input=datum.model_input, loss_fn_inputs=inputs))
    configs: dict[str, dict[str, float] | None] = {
        "importance_sampling": None,
        "ppo": {"clip_low_threshold": 0.7},
        "cispo": None,
        "dro": {"beta": 0.05},
        "gspo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    }
    trainer = _trainer()
    for loss_fn, config in configs.items():
        used = [
            types.Datum(
                model_input=d.model_input,
                loss_fn_inputs={
                    k: v
                    for k, v in d.loss_fn_inputs.items()
                    if k != "sequence_ratio_mask" or loss_fn == "gspo"
                },
            )
            for d in data
        ]
        out = trainer.forward(used, loss_fn, config).result()  # type: ignore[arg-type]
        assert np.isfinite(out.metrics["loss:sum"]), loss_fn
        assert [o["logprobs"].to_numpy().shape[0] for o in out.loss_fn_outputs] == [
            len(prompt) + 4
        ] * 6
    sft = [_sft_datum(text) for text in TEXTS[:6]]
    adam = types.AdamParams(learning_rate=1e-2)
    whole, halves = _trainer(), _trainer()
    whole_loss = whole.forward_backward(sft, "cross_entropy").result().metrics["loss:sum"]
    half_losses = [
        halves.forward_backward(sft[:2], "cross_entropy").result().metrics["loss:sum"],
        halves.forward_backward(sft[2:], "cross_entropy").result().metrics["loss:sum"],
    ]
    assert sum(half_losses) == pytest.approx(whole_loss, rel=1e-5)
    whole.optim_step(adam)
    halves.optim_step(adam)
    for x, y in zip(
        jax.tree_util.tree_leaves(whole.params),
        jax.tree_util.tree_leaves(halves.params),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)


def test_optim_step_passes_every_adam_field() -> None:
    trainer = _trainer()
    trainer.forward_backward([_sft_datum(t) for t in TEXTS[:3]], "cross_entropy")
    grads, params, state = trainer._grads, trainer.params, trainer._opt_state
    adam = types.AdamParams(
        learning_rate=0.02, beta1=0.5, beta2=0.7, eps=1e-3, weight_decay=0.3, grad_clip_norm=0.1
    )
    response = trainer.optim_step(adam).result()
    hyper = model_lib.AdamHyperparams(
        learning_rate=0.02, beta1=0.5, beta2=0.7, eps=1e-3, weight_decay=0.3, grad_clip_norm=0.1
    )
    expected, _, norm = model_lib.apply_adam_update(params, state, grads, hyper)
    assert _params_equal(trainer.params, expected)
    assert response.metrics is not None and response.metrics["grad_norm"] == pytest.approx(
        float(norm)
    )
    before = trainer.params
    trainer.forward_backward([_sft_datum(t) for t in TEXTS[:3]], "cross_entropy")
    trainer.optim_step(types.AdamParams(learning_rate=0.0))
    assert _params_equal(trainer.params, before)


def test_data_are_validated_with_errors_naming_the_datum_and_key() -> None:
    trainer = _trainer()
    good = _sft_datum("ab=1")
    with_mask = types.Datum(
        model_input=good.model_input,
        loss_fn_inputs={**good.loss_fn_inputs, "mask": _td(np.ones(4))},
    )
    with pytest.raises(ValueError, match=r"Datum\[1\]\.loss_fn_inputs: unknown key 'mask'"):
        trainer.forward_backward([good, with_mask], "cross_entropy")
    short = types.Datum(
        model_input=good.model_input,
        loss_fn_inputs={"target_tokens": [1, 2], "weights": [1.0, 1.0]},  # type: ignore[dict-item]
    )
    with pytest.raises(ValueError, match=r"Datum\[0\]\.loss_fn_inputs\['target_tokens'\]: shape"):
        trainer.forward_backward([short], "cross_entropy")
    with pytest.raises(ValueError, match=r"every datum needs loss_fn_inputs \['weights'\]"):
        trainer.forward_backward(
            [
                types.Datum(
                    model_input=good.model_input,
                    loss_fn_inputs={"target_tokens": _td([1, 2, 3, 4], np.int64)},
                )
            ],
            "cross_entropy",
        )
    with pytest.raises(ValueError, match="no data"):
        trainer.forward_backward([], "cross_entropy")
    with pytest.raises(TypeError, match=r"Datum\[0\]: expected tinker.Datum"):
        trainer.forward_backward([{"model_input": good.model_input}], "cross_entropy")  # type: ignore[list-item]
    with pytest.raises(ValueError, match="unknown loss_fn 'nll'"):
        trainer.forward_backward([good], "nll")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be given"):
        trainer.forward_backward([_rl_datum([1, 2], [3], [-1.0], 1.0)], "dro")
    bad_target = types.Datum(
        model_input=good.model_input,
        loss_fn_inputs={"target_tokens": _td([1, 2, 3, 900], np.int64), "weights": _td([1.0] * 4)},
    )
    with pytest.raises(ValueError, match="token 900 at position 3"):
        trainer.forward_backward([bad_target], "cross_entropy")
    float_target = types.Datum(
        model_input=good.model_input,
        loss_fn_inputs={"target_tokens": _td([1.0, 2, 3, 4]), "weights": _td([1.0] * 4)},
    )
    with pytest.raises(TypeError, match="integer token ids"):
        trainer.forward_backward([float_target], "cross_entropy")
    assert trainer._grads is None  # nothing accumulated by the refused calls


def test_second_forward_backward_in_the_same_bucket_does_not_retrace() -> None:
    trainer = _trainer()
    trainer.forward_backward([_sft_datum(t) for t in TEXTS[:3]], "cross_entropy")
    # More datums (7 ≤ 8) and longer ones (≤ 16 tokens): same buckets, no new trace.
    with count_compiles() as compiled:
        trainer.forward_backward(
            [_sft_datum(t + "9" * i) for i, t in enumerate(TEXTS[:7])], "cross_entropy"
        )
    stages = (model_forward_vjp, loss_and_logprob_grad, model_backward)
    assert [compiled.traces_of(stage) for stage in stages] == [0, 0, 0]


def test_prompts_that_begin_alike_are_prefilled_with_their_common_prefix_once(
    sampled_batches: list[model_lib.SampleBatch],
) -> None:
    # 8 concurrent requests whose prompts share a 36-token system text: one call, the prefix
    # computed once (a 64-position prefix row and 8 suffix rows of 16, not 8 rows of 64); each
    # request alone (no one to share with) samples the same tokens, logprobs to reassociation
    sampler = _trainer().save_weights_and_get_sampling_client().result()
    system = "You add numbers. Reply with the sum only."[:36]
    questions = [f"{i}+{i * 3}=" for i in range(8)]
    prompts = [_prompt(system + q) for q in questions]
    params = [
        types.SamplingParams(max_tokens=8, temperature=1.0, seed=i, stop=[]) for i in range(8)
    ]
    alone = [sampler.sample(p, 1, sp).result() for p, sp in zip(prompts, params, strict=True)]
    calls = sampled_batches
    calls.clear()
    batched = asyncio.run(
        _gather_samples(sampler, [(p, 1, sp) for p, sp in zip(prompts, params, strict=True)])
    )
    [batch] = calls
    assert np.asarray(batch.shared_prefix_length).tolist() == 37  # BOS too
    assert batch.prefix_widths == (64, 16)
    for x, y in zip(alone, batched, strict=True):
        assert [s.tokens for s in x.sequences] == [s.tokens for s in y.sequences]
        for s, t in zip(x.sequences, y.sequences, strict=True):
            np.testing.assert_allclose(_lps(s), _lps(t), atol=1e-4)
    # another common length in the same buckets: the same program
    other = [_prompt(system[:33] + q) for q in questions]
    with count_compiles() as compiled:
        asyncio.run(_gather_samples(sampler, [(p, 1, params[0]) for p in other]))
    assert np.asarray(calls[-1].shared_prefix_length).tolist() == 34
    assert calls[-1].prefix_widths == (64, 16)
    assert compiled.traces_of(model_lib._sampling.sample_tokens) == 0


def test_sampling_one_to_eight_samples_needs_two_sampler_programs() -> None:
    # 2..8 samples of one prompt go on the grid of the 8-row bucket (rows_per_prompt = 8 / 1),
    # 1 sample flat: two programs for eight request sizes, not one per size
    sampler = _trainer().save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=4, temperature=1.0, seed=0, stop=[])
    for n in (1, 2):
        sampler.sample(_prompt("a"), n, params).result()
    with count_compiles() as compiled:
        for n in range(1, 9):
            assert len(sampler.sample(_prompt("a"), n, params).result().sequences) == n
    assert compiled.traces_of(model_lib.sample_tokens) == 0


def test_a_sample_batch_whose_rows_do_not_fit_its_grid_is_refused() -> None:
    config = model_lib.get_model_config(MODEL)
    params = _trainer().save_weights_and_get_sampling_client().result()._params
    b, v = 6, config.vocab_size
    batch = model_lib.SampleBatch(
        prompt_tokens_B_T=np.ones((4, 8), np.int32),
        prompt_length_B=np.full(4, 8, np.int32),
        max_new_tokens_B=np.full(b, 2, np.int32),
        temperature_B=np.ones(b, np.float32),
        top_k_B=np.zeros(b, np.int32),
        top_p_B=np.ones(b, np.float32),
        key_material_B_K=np.zeros((b, 1), np.uint32),
        stop_token_mask_B_V=np.zeros((b, v), bool),
        stop_seqs_B_Q_W=np.full((b, 1, 1), -1, np.int32),
        stop_seq_valid_B_Q=np.zeros((b, 1), bool),
        rows_per_prompt=2,
    )
    with pytest.raises(ValueError, match=r"6 rows .* rows_per_prompt = 2 for each of the 4"):
        model_lib.sample_tokens(params, batch, config=config, max_new_tokens=2)
    with pytest.raises(ValueError, match="at least 1"):
        model_lib.sample_tokens(
            params, msgspec.structs.replace(batch, rows_per_prompt=0), config=config,
            max_new_tokens=2,
        )  # fmt: skip
    indexed = msgspec.structs.replace(batch, prompt_index_B=np.zeros(b, np.int32))
    with pytest.raises(ValueError, match="takes no prompt_index_B"):
        model_lib.sample_tokens(params, indexed, config=config, max_new_tokens=2)


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("beta1", 1.0, r"in \[0, 1\)"),
        ("beta2", -3.0, r"in \[0, 1\)"),
        ("learning_rate", -1.0, ">= 0"),
        ("eps", 0.0, "> 0"),
        ("weight_decay", -0.1, ">= 0"),
        ("grad_clip_norm", -1.0, ">= 0"),
    ],
)
def test_adam_params_out_of_range_are_refused_before_the_step(
    field: str, value: float, rule: str
) -> None:
    # beta1 = 1 zeroes Adam's bias correction: every weight became NaN, for good
    trainer = _trainer()
    before = jax.tree_util.tree_map(np.asarray, trainer.params)
    params = types.AdamParams(**{"learning_rate": 1e-3, field: value})
    with pytest.raises(ValueError, match=rf"AdamParams\.{field}: expected a value {rule}, got"):
        trainer.optim_step(params)
    after = jax.tree_util.tree_map(np.asarray, trainer.params)
    assert all(
        np.array_equal(x, y)
        for x, y in zip(
            jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(after), strict=True
        )
    )


def test_chunked_training_and_sampling_equal_unchunked() -> None:
    data = [_sft_datum(text) for text in TEXTS]
    adam = types.AdamParams(learning_rate=1e-2)
    whole = _trainer()
    chunked = LocalServiceClient(seed=0, max_train_tokens=64, max_batch_rows=4)
    parts = chunked.create_lora_training_client(base_model=MODEL).result()  # 4 datums a call
    out_whole = whole.forward_backward(data, "cross_entropy").result()
    out_parts = parts.forward_backward(data, "cross_entropy").result()
    assert out_parts.metrics["loss:sum"] == pytest.approx(out_whole.metrics["loss:sum"], rel=1e-5)
    for a, b in zip(out_whole.loss_fn_outputs, out_parts.loss_fn_outputs, strict=True):
        np.testing.assert_allclose(a["logprobs"].to_numpy(), b["logprobs"].to_numpy(), atol=1e-6)
    whole.optim_step(adam)
    parts.optim_step(adam)
    for x, y in zip(
        jax.tree_util.tree_leaves(whole.params),
        jax.tree_util.tree_leaves(parts.params),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)
    seeded = types.SamplingParams(max_tokens=16, seed=4, stop=[])
    sampler = whole.save_weights_and_get_sampling_client().result()
    saved = whole.save_weights_for_sampler("chunked").result().path
    split = chunked.create_sampling_client(model_path=saved).result()  # 4 rows a call

    async def many(client: LocalSamplingClient) -> list[list[int]]:
        responses = await asyncio.gather(
            *[client.sample_async(_prompt(t), 3, seeded) for t in TEXTS[:2]]
        )
        return [s.tokens for r in responses for s in r.sequences]

    # 6 rows in chunks of 4: the second request's samples span two jitted calls.
    assert asyncio.run(many(split)) == asyncio.run(many(sampler))
    merged = merge_metrics(
        [
            {"loss:sum": 1.0, "ratio:mean": 2.0, "ratio:min": 0.5, "action_tokens:sum": 1.0},
            {"loss:sum": 2.0, "ratio:mean": 5.0, "ratio:min": 0.2, "action_tokens:sum": 3.0},
        ]
    )
    assert merged == {
        "loss:sum": 3.0,
        "ratio:mean": 4.25,
        "ratio:min": 0.2,
        "action_tokens:sum": 4.0,
    }
    # a chunk without action tokens (a constant-reward group's datums) reports ratio 1.0, a
    # placeholder: the call's extremes are the other chunks' (they used to take it in)
    idle = {"loss:sum": 0.0, "ratio:min": 1.0, "ratio:max": 1.0, "action_tokens:sum": 0.0}
    busy = {"loss:sum": 2.0, "ratio:min": 0.2, "ratio:max": 0.5, "action_tokens:sum": 3.0}
    merged = merge_metrics([busy, idle])
    assert (merged["ratio:min"], merged["ratio:max"]) == (0.2, 0.5)
    assert merge_metrics([idle, idle])["ratio:max"] == 1.0


def test_a_chunk_without_action_tokens_leaves_the_ratio_extremes_alone() -> None:
    # one datum with advantages, one without (a constant-reward group's), in one call and in
    # one chunk each: the metrics agree (the idle chunk's placeholder ratio 1.0 used to become
    # the call's ratio:max)
    prompt = TOK.encode("p=")
    data = [
        _rl_datum(prompt, tokens, [0.0] * len(tokens), advantage)
        for tokens, advantage in (
            (TOK.encode("hello world, abcdefgh"), 1.0),
            (TOK.encode("zzzz qqqq"), 0.0),
        )
    ]
    metrics = {}
    for tokens in (16384, 16):
        service = LocalServiceClient(seed=0, temporary_checkpoints=True, max_train_tokens=tokens)
        trainer = service.create_lora_training_client(base_model=MODEL).result()
        trainer.prefix_sharing_fraction = 0.0
        metrics[tokens] = trainer.forward(data, "ppo").result().metrics
    assert metrics[16]["ratio:max"] < 0.5  # every ratio exp(lp − 0) of a real datum
    for key, value in metrics[16384].items():
        assert metrics[16][key] == pytest.approx(value, rel=1e-5), key


def _bandit_rewards(loss_fn: str, config: dict[str, float] | None, steps: int = 30) -> list[float]:
    """A one-token bandit: reward 1 for a byte < 128. Group-centred advantages, 8 samples."""
    trainer = _trainer()
    prompt = TOK.encode("p")
    params = types.SamplingParams(max_tokens=1, temperature=1.0, stop=[])
    rewards = []
    for _ in range(steps):
        sampler = trainer.save_weights_and_get_sampling_client().result()
        sequences = sampler.sample(types.ModelInput.from_ints(prompt), 8, params).result().sequences
        reward_G = np.array([float(s.tokens[0] < 128) for s in sequences])
        rewards.append(float(reward_G.mean()))
        advantage_G = reward_G - reward_G.mean()
        if not advantage_G.any():
            continue
        data = []
        for seq, advantage in zip(sequences, advantage_G, strict=True):
            datum = _rl_datum(prompt, seq.tokens, _lps(seq), float(advantage))
            inputs = dict(datum.loss_fn_inputs)
            if loss_fn == "gspo":
                inputs["sequence_ratio_mask"] = _td([0.0, 1.0])
            data.append(types.Datum(model_input=datum.model_input, loss_fn_inputs=inputs))
        trainer.forward_backward(data, loss_fn, config)  # type: ignore[arg-type]
        trainer.optim_step(types.AdamParams(learning_rate=1e-2))
    return rewards


@pytest.mark.parametrize(
    ("loss_fn", "config"),
    [
        ("importance_sampling", None),
        ("ppo", None),
        ("cispo", None),
        ("dro", {"beta": 0.05}),
        ("gspo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
    ],
)
def test_reward_rises_on_a_toy_bandit_for_every_policy_loss(
    loss_fn: str, config: dict[str, float] | None
) -> None:
    rewards = _bandit_rewards(loss_fn, config)
    assert np.mean(rewards[:5]) < 0.8
    assert np.mean(rewards[-5:]) >= 0.9


def test_custom_model_configs_and_checkpoints_carry_their_config(tmp_path: Path) -> None:
    micro = model_lib.ModelConfig(
        vocab_size=259, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=64
    )
    service = LocalServiceClient(seed=3, checkpoint_dir=tmp_path, model_configs={"my/micro": micro})
    names = [m.model_name for m in service.get_server_capabilities().supported_models]
    assert "my/micro" in names and MODEL in names
    trainer = service.create_lora_training_client(base_model="my/micro").result()
    assert trainer.config == micro and model_lib.count_params(trainer.params) < 20_000
    path = trainer.save_state("init").result().path
    # A service that does not know the name still restores the model from the checkpoint.
    restored = LocalServiceClient(seed=0).create_training_client_from_state(path).result()
    assert restored.config == micro and _params_equal(restored.params, trainer.params)
    with pytest.raises(CheckpointError, match="does not match"):
        LocalServiceClient(seed=0).create_training_client_from_state(path, base_model=MODEL)
    with pytest.raises(CheckpointError, match="cannot read"):
        service.create_training_client_from_state(str(tmp_path / "missing"))


def _rl_steps(trainer: LocalTrainingClient, n_steps: int) -> list[list[int]]:
    """`n_steps` sample → importance_sampling → Adam steps; returns every sampled sequence."""
    tokens = []
    for _ in range(n_steps):
        sampler = trainer.save_weights_and_get_sampling_client().result()
        data = []
        for text in ("1+2=", "3+4="):
            prompt = TOK.encode(text)
            response = sampler.sample(types.ModelInput.from_ints(prompt), 2, SP10).result()
            for i, seq in enumerate(response.sequences):
                data.append(_rl_datum(prompt, seq.tokens, _lps(seq), 1.0 if i else -1.0))
                tokens.append(seq.tokens)
        trainer.forward_backward(data, "importance_sampling")
        trainer.optim_step(types.AdamParams(learning_rate=1e-3))
    return tokens


def test_a_resumed_run_continues_exactly_like_the_uninterrupted_one(tmp_path: Path) -> None:
    trainer = _trainer(seed=4, tmp_path=tmp_path)
    _rl_steps(trainer, 2)
    path = trainer.save_state("mid").result().path
    expected_tokens = _rl_steps(trainer, 2)
    resumed = (
        LocalServiceClient(seed=4).create_training_client_from_state_with_optimizer(path).result()
    )
    assert _rl_steps(resumed, 2) == expected_tokens
    assert _params_equal(resumed.params, trainer.params)
