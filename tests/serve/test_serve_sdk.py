"""`rlpure serve` driven by the unmodified tinker SDK (0.38) on `rlpure/tiny`.

What this proves: a GRPO loop runs through the SDK in its sync and async styles; the server
computes what an in-process `LocalServiceClient(seed=0)` computes for the same calls (samples,
every loss, forward, logprobs, optimizer steps); a saved state resumes exactly with its Adam
state and differs without it; samplers on saved weights sample like the snapshot they were
saved from; a run resumes across a server restart; pickled sampling clients in two other
processes sample while the parent trains.

Conventions:
- One module-scoped server serves every test but the restart test (which needs its own state
  dir and two server processes); each test gets its own SDK session (`service`). A training
  client's numbers depend only on the service seed and its own calls (a snapshot sampler draws
  from its training client's stream), so tests sharing the server stay comparable with a fresh
  in-process `LocalServiceClient(seed=0)` (`local`).
- Numbers are compared with `assert_array_equal` (or `==` on metric dicts): the server runs the
  same jitted programs on the same inputs. One thing is not reproducible bit for bit: the
  *logprobs* of samples requested concurrently (`_assert_same_samples(exact=False)`). The local
  sampler serves the requests that arrive in one event-loop tick as one call whose row count
  is bucketed, and XLA's CPU kernels for a 4-row and a 16-row batch round the last bit
  differently: in-process, `gather` of three 4-sample requests (one 12-row call) gives
  `-5.565812587738037` where the same requests made one at a time (4-row calls) give
  `-5.565812110900879` (seed 10, prompt `2+2=`, step 0). On the server, which requests share a
  tick depends on when their HTTP requests arrive. The tokens still match exactly (a sample's
  random key does not depend on its batch), the logprobs to `SAMPLE_LOGPROB_ATOL`, and the
  loop comparison then trains both sides on the server's datums, so every training number is
  still compared exactly. Requests made one at a time are compared exactly.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import tinker
from tinker import types

from shell.local import LocalServiceClient
from tests.serve.server import Server, assert_same_output, child_env, running_server, sdk_env

# The SDK 0.38 deprecates `sample_async` and the other `*_async` methods in favour of awaiting
# the futures; the async style here uses both, as scripts written for the SDK do.
pytestmark = pytest.mark.filterwarnings("ignore:DEPRECATED:FutureWarning")

MODEL = "rlpure/tiny"
RANK = 8  # recorded only: a toy model trains every weight
PROMPTS_P = (b"2+2=", b"hello", b"abc")
GROUP = 4
MAX_TOKENS = 8
STEPS = 3
RL_LOSS: types.LossFnType = "importance_sampling"
ADAM = types.AdamParams(learning_rate=1e-2)
SAMPLE_LOGPROB_ATOL = 1e-5
"""How far apart one sample's logprobs may be when computed in batches of different shapes
(module doc). An absolute bound, since a logprob is `logit - logsumexp(logits)` in float32:
the rounding error is a few ulps of the logits' size (ulp(10) ~ 1e-6), not of the logprob's,
so a logprob near 0 may differ by more than `rtol=1e-6` of itself (seen: -1.2447264 vs
-1.2447251)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("serve-sdk") / "state") as served:
        yield served


def _point_sdk_at(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in sdk_env(server).items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def service(server: Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[tinker.ServiceClient]:
    _point_sdk_at(server, monkeypatch)
    client = tinker.ServiceClient()
    yield client
    client.close("success").result()


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalServiceClient]:
    with LocalServiceClient(seed=0, checkpoint_dir=tmp_path / "local") as client:
        yield client


# -- inputs --


def _prompt(text: bytes) -> types.ModelInput:
    return types.ModelInput.from_ints(list(text))


def _sampling_params(seed: int | None = None) -> types.SamplingParams:
    return types.SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=seed)


def _tensors(arrays: Mapping[str, np.ndarray]) -> dict[str, types.TensorData]:
    return {key: types.TensorData.from_numpy(value) for key, value in arrays.items()}


def _reward(tokens: Sequence[int]) -> float:
    """A deterministic reward on the sampled tokens: the share of even token ids."""
    return float(np.mean(np.asarray(tokens) % 2 == 0)) if tokens else 0.0


def _rl_datum(prompt: bytes, sequence: types.SampledSequence, advantage: float) -> types.Datum:
    """Position i predicts token i+1; prompt targets carry logprob and advantage 0."""
    assert sequence.logprobs is not None
    tokens_T = [*prompt, *sequence.tokens]
    skipped = len(prompt) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens_T[:-1]),
        loss_fn_inputs=_tensors(
            {
                "target_tokens": np.array(tokens_T[1:], np.int64),
                "logprobs": np.array([0.0] * skipped + sequence.logprobs, np.float32),
                "advantages": np.array(
                    [0.0] * skipped + [advantage] * len(sequence.tokens), np.float32
                ),
            }
        ),
    )


def _group_datums(responses_P: Sequence[types.SampleResponse]) -> list[types.Datum]:
    """GRPO datums: each group's rewards centred on their mean are its advantages."""
    data_D = []
    for prompt, response in zip(PROMPTS_P, responses_P, strict=True):
        rewards_G = np.array([_reward(sequence.tokens) for sequence in response.sequences])
        advantages_G = rewards_G - rewards_G.mean()
        data_D += [
            _rl_datum(prompt, sequence, float(advantage))
            for sequence, advantage in zip(response.sequences, advantages_G, strict=True)
        ]
    return data_D


def _fixed_datums(loss: str, top_k: Sequence[int] = (0, 0, 0)) -> list[types.Datum]:
    """Three datums with the inputs `loss` reads; for the RL losses the behaviour logprobs sit
    at the untrained model's (about -ln 259) ± 0.7, so the ratios (0.5 to 2) cross every clip
    threshold used here. Where `top_k[i]` is not 0, datum `i`'s `cross_entropy` targets and
    weights are `(N, top_k[i])`
    soft targets (top-K distillation), the datum's own next token first."""
    data_D = []
    for index, prompt in enumerate(PROMPTS_P):
        tokens_T = [*prompt, *b" reply %d" % index]
        targets_T = np.array(tokens_T[1:], np.int64)
        action_T = np.arange(targets_T.size) >= len(prompt) - 1
        k = top_k[index]
        if loss == "cross_entropy" and k:
            soft_K = np.arange(k, 0, -1, dtype=np.float32) / (k * (k + 1) / 2)
            inputs: dict[str, np.ndarray] = {
                "target_tokens": (targets_T[:, None] + 7 * np.arange(k)) % 256,
                "weights": action_T[:, None] * soft_K,
            }
        elif loss == "cross_entropy":
            inputs = {
                "target_tokens": targets_T,
                "weights": action_T.astype(np.float32),
            }
        else:
            behaviour_T = -np.log(259.0) + np.linspace(-0.7, 0.7, targets_T.size)
            advantage = 1.0 if index % 2 == 0 else -0.5
            inputs = {
                "target_tokens": targets_T,
                "logprobs": np.where(action_T, behaviour_T, 0.0).astype(np.float32),
                "advantages": np.where(action_T, advantage, 0.0).astype(np.float32),
            }
        data_D.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens_T[:-1]),
                loss_fn_inputs=_tensors(inputs),
            )
        )
    return data_D


# -- calls, the same on an SDK client and a local one --


class Step(NamedTuple):
    loss: types.ForwardBackwardOutput
    optim: types.OptimStepResponse


def _train_step(training: Any, data_D: list[types.Datum], loss: types.LossFnType = RL_LOSS) -> Step:
    return Step(
        training.forward_backward(data_D, loss).result(), training.optim_step(ADAM).result()
    )


async def _sample_group(sampler: Any, step: int) -> list[types.SampleResponse]:
    """`GROUP` samples of every prompt, requested concurrently, seeded by (step, prompt)."""
    return list(
        await asyncio.gather(
            *(
                sampler.sample_async(_prompt(prompt), GROUP, _sampling_params(100 * step + index))
                for index, prompt in enumerate(PROMPTS_P)
            )
        )
    )


@dataclass
class Trace:
    """What a GRPO run saw and computed, step by step."""

    samples: list[list[types.SampleResponse]] = field(default_factory=list)
    data: list[list[types.Datum]] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)


def _grpo_sync(service: Any, *, replay: Trace | None = None) -> Trace:
    """`STEPS` GRPO steps in the SDK's sync style (`.result()`). With `replay`, it trains on
    `replay`'s datums instead of its own (module doc: sampled logprobs may differ by ulps)."""
    training = service.create_lora_training_client(MODEL, rank=RANK).result()
    trace = Trace()
    for step in range(STEPS):
        sampler = training.save_weights_and_get_sampling_client().result()
        responses_P = asyncio.run(_sample_group(sampler, step))
        data_D = _group_datums(responses_P) if replay is None else replay.data[step]
        trace.samples.append(responses_P)
        trace.data.append(data_D)
        trace.steps.append(_train_step(training, data_D))
    return trace


async def _grpo_async(service: Any, *, replay: Trace | None = None) -> Trace:
    """`_grpo_sync` in the async style: awaited futures and `*_async` calls, with
    `optim_step` submitted before the `forward_backward` result is awaited."""
    training = await service.create_lora_training_client(MODEL, rank=RANK)
    trace = Trace()
    for step in range(STEPS):
        sampler = await training.save_weights_and_get_sampling_client_async()
        responses_P = await _sample_group(sampler, step)
        data_D = _group_datums(responses_P) if replay is None else replay.data[step]
        loss_future = await training.forward_backward_async(data_D, RL_LOSS)
        optim_future = training.optim_step(ADAM)
        trace.samples.append(responses_P)
        trace.data.append(data_D)
        trace.steps.append(Step(await loss_future, await optim_future))
    return trace


# -- comparisons --


def _assert_same_samples(
    served: Sequence[types.SampleResponse],
    reference: Sequence[types.SampleResponse],
    *,
    exact: bool,
) -> None:
    """Same tokens and stop reasons; logprobs equal, or within `SAMPLE_LOGPROB_ATOL` when
    `exact` is False (requests sent concurrently: module doc)."""
    assert len(served) == len(reference)
    for got, want in zip(served, reference, strict=True):
        assert len(got.sequences) == len(want.sequences)
        for got_seq, want_seq in zip(got.sequences, want.sequences, strict=True):
            assert got_seq.tokens == want_seq.tokens
            assert got_seq.stop_reason == want_seq.stop_reason
            got_lp, want_lp = np.array(got_seq.logprobs), np.array(want_seq.logprobs)
            if exact:
                np.testing.assert_array_equal(got_lp, want_lp)
            else:
                np.testing.assert_allclose(got_lp, want_lp, rtol=0, atol=SAMPLE_LOGPROB_ATOL)


def _assert_same_steps(served: Sequence[Step], reference: Sequence[Step]) -> None:
    assert len(served) == len(reference)
    for got, want in zip(served, reference, strict=True):
        assert_same_output(got.loss, want.loss)
        assert got.optim.metrics == want.optim.metrics


# -- 1. GRPO through the SDK, as in-process --


def _check_grpo_trace(trace: Trace) -> None:
    """It is a GRPO run: full groups, each sampled from the weights the last step made."""
    for responses_P, data_D, step in zip(trace.samples, trace.data, trace.steps, strict=True):
        assert [len(response.sequences) for response in responses_P] == [GROUP] * len(PROMPTS_P)
        assert all(
            1 <= len(sequence.tokens) <= MAX_TOKENS
            for response in responses_P
            for sequence in response.sequences
        )
        assert len(data_D) == len(step.loss.loss_fn_outputs) == GROUP * len(PROMPTS_P)
        # The snapshot's logprobs are the learner's at every step (importance ratio 1 to
        # ~1e-6): a sampler left on older weights would be off by far more after an Adam
        # step of 1e-2 on every weight.
        assert abs(step.loss.metrics["ratio:min"] - 1) < 1e-5
        assert abs(step.loss.metrics["ratio:max"] - 1) < 1e-5
        assert step.optim.metrics is not None
        assert 0 < step.optim.metrics["grad_norm"] < np.inf  # the rewards varied in a group


@pytest.mark.slow
@pytest.mark.parametrize("style", ["sync", "async"])
def test_grpo_loop_through_the_sdk_matches_in_process(
    style: str, service: tinker.ServiceClient, local: LocalServiceClient
) -> None:
    def run(client: Any, replay: Trace | None = None) -> Trace:
        if style == "sync":
            return _grpo_sync(client, replay=replay)
        return asyncio.run(_grpo_async(client, replay=replay))

    served = run(service)
    _check_grpo_trace(served)
    reference = run(local, replay=served)
    for got, want in zip(served.samples, reference.samples, strict=True):
        _assert_same_samples(got, want, exact=False)
    _assert_same_steps(served.steps, reference.steps)


# -- 2. every loss, forward and logprobs, as in-process --


def _loss_steps(
    service: Any,
    loss: types.LossFnType,
    config: dict[str, float] | None,
    top_k: Sequence[int] = (0, 0, 0),
) -> list[Any]:
    """A fresh model: forward_backward, optim_step, then the next forward_backward."""
    training = service.create_lora_training_client(MODEL, rank=RANK).result()
    data_D = _fixed_datums(loss, top_k)
    first = training.forward_backward(data_D, loss, config).result()
    optim = training.optim_step(ADAM).result()
    after = training.forward_backward(data_D, loss, config).result()
    return [first, optim, after]


@pytest.mark.parametrize(
    ("loss", "config", "top_k"),
    [
        ("cross_entropy", None, (0, 0, 0)),
        ("cross_entropy", None, (3, 3, 3)),
        ("cross_entropy", None, (3, 0, 2)),
        ("importance_sampling", None, (0, 0, 0)),
        ("ppo", None, (0, 0, 0)),
        ("cispo", None, (0, 0, 0)),
        ("dro", {"beta": 0.5}, (0, 0, 0)),
        ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}, (0, 0, 0)),
    ],
    ids=[
        "cross_entropy",
        "cross_entropy-top3",
        "cross_entropy-mixed-K",
        "importance_sampling",
        "ppo",
        "cispo",
        "dro-beta",
        "ppo-clip",
    ],
)
def test_each_loss_computes_what_it_computes_in_process(
    loss: types.LossFnType,
    config: dict[str, float] | None,
    top_k: tuple[int, int, int],
    service: tinker.ServiceClient,
    local: LocalServiceClient,
) -> None:
    first, optim, after = _loss_steps(service, loss, config, top_k)
    want_first, want_optim, want_after = _loss_steps(local, loss, config, top_k)
    shapes = [output["logprobs"].to_numpy().shape[1:] for output in first.loss_fn_outputs]
    assert shapes == [(k,) if k else () for k in top_k]  # each datum's own, through the wire
    assert_same_output(first, want_first)
    assert optim.metrics == want_optim.metrics
    assert_same_output(after, want_after)
    assert first.metrics["loss:sum"] != after.metrics["loss:sum"]  # the step moved the weights
    if config is not None and loss == "ppo":  # the config reached the loss
        default = local.create_lora_training_client(MODEL, rank=RANK).result()
        unclipped = default.forward(_fixed_datums(loss), loss).result()
        assert unclipped.metrics["loss:sum"] != first.metrics["loss:sum"]


class Probes(NamedTuple):
    forward: types.ForwardBackwardOutput
    logprobs: list[float | None]
    logprobs_last: list[float | None]
    sampled: types.SampleResponse
    sampled_last: types.SampleResponse
    unseeded: list[types.SampleResponse]


PROBE = b"count: 1 2 3"
LAST_N = 3
TOPK = 3
TARGET_IDS = np.full((len(PROBE) - 1, 2), -1, np.int64)  # ids scored after PROBE[: i + 1]
TARGET_IDS[:, 0] = list(PROBE[1:])  # the prompt's own tokens: its prompt logprobs
TARGET_IDS[4, 1] = ord("z")
SPARSE_TARGETS = types.TensorData(  # column 1 alone, sparse CSR: [4, 1] and [9, 1]
    data=[ord("z"), ord("q")],
    dtype="int64",
    shape=[len(PROBE) - 1, 2],
    sparse_crow_indices=[0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2],
    sparse_col_indices=[1, 1],
)


def _probes(service: Any) -> Probes:
    """After one step: `forward`, prompt logprobs three ways, and unseeded samples requested
    one at a time (their keys come from the snapshot's stream and request count)."""
    training = service.create_lora_training_client(MODEL, rank=RANK).result()
    data_D = _fixed_datums("cross_entropy")
    _train_step(training, data_D, "cross_entropy")
    sampler = training.save_weights_and_get_sampling_client().result()
    prompt, params = _prompt(PROBE), _sampling_params(seed=5)
    unseeded = [
        sampler.sample(_prompt(text), GROUP, _sampling_params()).result() for text in PROMPTS_P
    ]
    return Probes(
        forward=training.forward(data_D, "cross_entropy").result(),
        logprobs=sampler.compute_logprobs(prompt).result(),
        logprobs_last=sampler.compute_logprobs(prompt, prompt_logprobs_last_n=LAST_N).result(),
        sampled=sampler.sample(
            prompt,
            2,
            params,
            include_prompt_logprobs=True,
            topk_prompt_logprobs=TOPK,
            topk_sample_logprobs=TOPK,
            target_prompt_logprobs=types.TensorData.from_numpy(TARGET_IDS),
            prompt_alt_tokens_k=TOPK,
        ).result(),
        sampled_last=sampler.sample(
            prompt,
            2,
            params,
            include_prompt_logprobs=True,
            topk_prompt_logprobs=TOPK,
            target_prompt_logprobs=SPARSE_TARGETS,
            prompt_logprobs_last_n=LAST_N,
        ).result(),
        unseeded=unseeded,
    )


def _tensor_parts(tensor: types.TensorData) -> tuple[Any, ...]:
    """What a `TensorData` holds, comparable with `==` (its values as a list)."""
    return (
        tensor.dtype,
        tensor.shape,
        np.asarray(tensor.data).tolist(),
        tensor.sparse_crow_indices,
        tensor.sparse_col_indices,
    )


def test_forward_logprobs_and_unseeded_samples_match_in_process(
    service: tinker.ServiceClient, local: LocalServiceClient
) -> None:
    served, reference = _probes(service), _probes(local)
    assert_same_output(served.forward, reference.forward)
    assert served.logprobs == reference.logprobs
    assert served.logprobs_last == reference.logprobs_last
    assert served.sampled.prompt_logprobs == reference.sampled.prompt_logprobs
    assert served.sampled_last.prompt_logprobs == reference.sampled_last.prompt_logprobs
    _assert_same_samples([served.sampled], [reference.sampled], exact=True)
    _assert_same_samples(served.unseeded, reference.unseeded, exact=True)
    # Within the server: what each view of the prompt logprobs holds.
    full = served.logprobs
    assert len(full) == len(PROBE) and full[0] is None and None not in full[1:]
    assert served.sampled.prompt_logprobs == full
    skipped = len(PROBE) - LAST_N
    for last in (served.logprobs_last, served.sampled_last.prompt_logprobs):
        assert last == [None] * skipped + full[skipped:]
    # Top-k prompt logprobs (proto `TopkLogprobs`): as in-process, the prompt's own token at
    # its logprob wherever it ranks, the last-N view the full one's tail.
    topk = served.sampled.topk_prompt_logprobs
    assert topk == reference.sampled.topk_prompt_logprobs
    assert served.sampled_last.topk_prompt_logprobs == reference.sampled_last.topk_prompt_logprobs
    assert topk is not None and topk[0] is None and all(len(e or []) == TOPK for e in topk[1:])
    checked = 0
    for token, entries, lp in zip(PROBE[1:], topk[1:], full[1:], strict=True):
        ranked = dict(entries or [])
        if token in ranked:  # another program than the prompt logprobs': the last bits differ
            assert ranked[token] == pytest.approx(lp, abs=SAMPLE_LOGPROB_ATOL)
            checked += 1
    assert checked > 0
    assert served.sampled_last.topk_prompt_logprobs == [None] * skipped + topk[skipped:]
    # Top-k sampled logprobs (each sequence's proto `TopkLogprobs`), as in-process.
    for got_seq, want_seq in zip(
        served.sampled.sequences, reference.sampled.sequences, strict=True
    ):
        assert got_seq.topk_logprobs is not None and len(got_seq.topk_logprobs) == len(
            got_seq.tokens
        )
        assert got_seq.topk_logprobs == want_seq.topk_logprobs
    assert served.sampled_last.sequences[0].topk_logprobs is None
    # Prompt alt tokens (proto `PromptAltTokens`): the same seeded draws as in-process.
    alt, want_alt = served.sampled.prompt_alt_tokens, reference.sampled.prompt_alt_tokens
    assert (
        alt is not None and want_alt is not None and served.sampled_last.prompt_alt_tokens is None
    )
    assert alt.tokens.to_numpy().shape == (len(PROBE) - 1, TOPK)
    assert _tensor_parts(alt.tokens) == _tensor_parts(want_alt.tokens)
    assert _tensor_parts(alt.logprobs) == _tensor_parts(want_alt.logprobs)
    # Target prompt logprobs (proto `Tensor`, dense or sparse as asked), as in-process.
    targeted, sparse = (p.target_prompt_logprobs for p in (served.sampled, served.sampled_last))
    assert targeted is not None and sparse is not None
    for got, want in ((targeted, reference.sampled), (sparse, reference.sampled_last)):
        assert want.target_prompt_logprobs is not None
        assert _tensor_parts(got) == _tensor_parts(want.target_prompt_logprobs)
    scores = targeted.to_numpy()
    own = np.array(full[1:], np.float64)
    np.testing.assert_allclose(scores[:, 0], own, rtol=0, atol=SAMPLE_LOGPROB_ATOL)
    assert scores[4, 1] < 0 and np.all(np.delete(scores[:, 1], 4) == 0.0)
    assert sparse.sparse_col_indices == [1, 1] and np.asarray(sparse.data)[0] == scores[4, 1]


def test_unseeded_samples_after_compute_logprobs_match_in_process(
    service: tinker.ServiceClient, local: LocalServiceClient
) -> None:
    def run(client: Any) -> list[types.SampleResponse]:
        training = client.create_lora_training_client(MODEL, rank=RANK).result()
        sampler = training.save_weights_and_get_sampling_client().result()
        sampler.compute_logprobs(_prompt(PROBE)).result()
        return [sampler.sample(_prompt(PROMPTS_P[0]), GROUP, _sampling_params()).result()]

    _assert_same_samples(run(service), run(local), exact=True)


# -- 3. save_state and load, samplers on saved weights --


def test_save_state_resumes_exactly_with_the_optimizer_and_not_without(
    service: tinker.ServiceClient,
) -> None:
    data_D = _fixed_datums(RL_LOSS)
    run = service.create_lora_training_client(MODEL, rank=RANK).result()
    for _ in range(2):
        _train_step(run, data_D)
    saved = run.save_state("two-steps").result().path
    assert saved == f"tinker://{run.model_id}/weights/two-steps"
    resumed = service.create_training_client_from_state_with_optimizer(saved).result()
    weights_only = service.create_training_client_from_state(saved).result()
    clients = (run, resumed, weights_only)

    at_save = [client.forward(data_D, RL_LOSS).result() for client in clients]
    steps = [_train_step(client, data_D) for client in clients]
    after = [client.forward(data_D, RL_LOSS).result() for client in clients]

    # Same weights everywhere at the save, so the same gradient.
    for index in (1, 2):
        assert_same_output(at_save[index], at_save[0])
        assert_same_output(steps[index].loss, steps[0].loss)
        assert steps[index].optim.metrics == steps[0].optim.metrics  # grad_norm
    # With Adam's moments (and step count) the update is the uninterrupted one ...
    assert_same_output(after[1], after[0])
    # ... without them it is a first Adam step from these weights: another update.
    assert after[2].metrics["loss:sum"] != after[0].metrics["loss:sum"]
    assert not np.array_equal(
        after[2].loss_fn_outputs[0]["logprobs"].to_numpy(),
        after[0].loss_fn_outputs[0]["logprobs"].to_numpy(),
    )


def test_samplers_on_saved_weights_sample_like_the_snapshot(
    service: tinker.ServiceClient,
) -> None:
    run = service.create_lora_training_client(MODEL, rank=RANK).result()
    _train_step(run, _fixed_datums(RL_LOSS))
    path = run.save_weights_for_sampler("after-one-step").result().path
    assert path == f"tinker://{run.model_id}/sampler_weights/after-one-step"
    snapshot = run.save_weights_and_get_sampling_client().result()
    samplers = [
        service.create_sampling_client(model_path=path).result(),
        run.create_sampling_client(path).result(),
    ]

    def draw(sampler: Any) -> list[types.SampleResponse]:
        return [
            sampler.sample(_prompt(text), GROUP, _sampling_params(seed=11 + index)).result()
            for index, text in enumerate(PROMPTS_P)
        ]

    expected = draw(snapshot)
    for sampler in samplers:
        _assert_same_samples(draw(sampler), expected, exact=True)


# -- 4. a server restart in the middle of a run --


@pytest.mark.slow
def test_a_run_resumes_across_a_server_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local: LocalServiceClient
) -> None:
    state = tmp_path / "state"
    data_D = _fixed_datums(RL_LOSS)
    with running_server(state) as first:
        _point_sdk_at(first, monkeypatch)
        service = tinker.ServiceClient()
        training = service.create_lora_training_client(MODEL, rank=RANK).result()
        steps = [_train_step(training, data_D) for _ in range(2)]
        saved = training.save_state("mid-run").result().path
        run_id = training.model_id
        assert run_id is not None
        first.stop()  # SIGTERM (its exit code is tests/serve's shutdown tests' business)
        assert first.process.poll() is not None
    # The same port, so the same SDK client (and its session) carries on against the new server.
    with running_server(state, port=first.port) as second:
        resumed = service.create_training_client_from_state_with_optimizer(saved).result()
        steps.append(_train_step(resumed, data_D))
        final = resumed.forward(data_D, RL_LOSS).result()
        rest = tinker.RestClient()
        run = rest.get_training_run(run_id).result()
        checkpoints = rest.list_checkpoints(run_id).result()
        service.close("success").result()
        assert second.process.poll() is None

    uninterrupted = local.create_lora_training_client(MODEL, rank=RANK).result()
    _assert_same_steps(steps, [_train_step(uninterrupted, data_D) for _ in range(STEPS)])
    assert_same_output(final, uninterrupted.forward(data_D, RL_LOSS).result())
    assert run.training_run_id == run_id
    assert run.base_model == MODEL
    assert run.last_checkpoint is not None and run.last_checkpoint.tinker_path == saved
    assert [c.tinker_path for c in checkpoints.checkpoints] == [saved]


# -- 5. clients in other processes, and many requests at once --

_CHILD = """
import asyncio, json, pickle, sys, warnings
warnings.simplefilter("ignore", FutureWarning)
import tinker

sampler, requests, group, max_tokens = pickle.loads(sys.stdin.buffer.read())


async def main():
    return await asyncio.gather(*(
        sampler.sample_async(
            tinker.ModelInput.from_ints(list(prompt)), group,
            tinker.SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed),
        )
        for prompt, seed in requests
    ))


responses = asyncio.run(main())
json.dump([[[s.tokens, s.logprobs] for s in r.sequences] for r in responses], sys.stdout)
"""

CHILD_REQUESTS = [(PROMPTS_P[seed % len(PROMPTS_P)], seed) for seed in range(16)]


def _start_children(server: Server, payload: bytes, tmp_path: Path) -> list[subprocess.Popen]:
    children = []
    for index in range(2):
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD],
            env=child_env(server),
            stdin=subprocess.PIPE,
            stdout=(tmp_path / f"child{index}.json").open("wb"),
            stderr=(tmp_path / f"child{index}.log").open("wb"),
        )
        assert child.stdin is not None
        child.stdin.write(payload)
        child.stdin.close()
        children.append(child)
    return children


def _as_lists(responses: Sequence[types.SampleResponse]) -> list:
    return [[[s.tokens, s.logprobs] for s in r.sequences] for r in responses]


@pytest.mark.slow
def test_pickled_samplers_in_two_processes_sample_while_the_parent_trains(
    server: Server, service: tinker.ServiceClient, tmp_path: Path
) -> None:
    data_D = _fixed_datums(RL_LOSS)
    training = service.create_lora_training_client(MODEL, rank=RANK).result()
    _train_step(training, data_D)
    sampler = training.save_weights_and_get_sampling_client().result()
    payload = pickle.dumps((sampler, CHILD_REQUESTS, GROUP, MAX_TOKENS))
    children = _start_children(server, payload, tmp_path)
    steps_meanwhile, deadline = 0, time.monotonic() + 120
    while any(child.poll() is None for child in children):
        _train_step(training, data_D)
        steps_meanwhile += 1
        assert time.monotonic() < deadline, "the child processes did not finish"
    assert steps_meanwhile >= 1
    for index, child in enumerate(children):
        assert child.returncode == 0, (tmp_path / f"child{index}.log").read_text()
    got = [json.loads((tmp_path / f"child{i}.json").read_text()) for i in range(2)]

    # 32 concurrent requests from one client: the children's 16, then 16 more.
    requests = [*CHILD_REQUESTS, *((prompt, seed + 1000) for prompt, seed in CHILD_REQUESTS)]

    async def many() -> list[types.SampleResponse]:
        return list(
            await asyncio.gather(
                *(
                    sampler.sample_async(_prompt(prompt), GROUP, _sampling_params(seed))
                    for prompt, seed in requests
                )
            )
        )

    mine = asyncio.run(many())
    assert len(mine) == 32
    assert all(len(response.sequences) == GROUP for response in mine)
    expected = _as_lists(mine[: len(CHILD_REQUESTS)])
    for child_result in got:
        assert len(child_result) == len(CHILD_REQUESTS)
        for child_seqs, my_seqs in zip(child_result, expected, strict=True):
            for (tokens, logprobs), (my_tokens, my_logprobs) in zip(
                child_seqs, my_seqs, strict=True
            ):
                assert tokens == my_tokens
                # concurrent requests: batch composition moves logprobs by ulps (module doc)
                np.testing.assert_allclose(logprobs, my_logprobs, rtol=0, atol=SAMPLE_LOGPROB_ATOL)
