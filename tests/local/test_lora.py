"""LoRA training and sampling of a pretrained model in the local backend.

A tiny random Llama checkpoint (width 64, 2 layers, GQA 4/2 heads, tied embeddings) is written
on the fly as a Hugging Face directory with a BPE tokenizer (`tests.local.hf_fixtures`) and
served by `LocalServiceClient` through M2's resolver (`base_model` is the directory's path):
step 0 equals the base model, only the adapters change and are checkpointed, checkpoints
refuse another base, samplers see base + adapters, and the sampling options behave. One
module-scoped service keeps the compiled shapes shared across the tests.
"""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tinker import types

from rlpure import model as model_lib
from rlpure.losses import LOSSES
from shell.errors import CheckpointError
from shell.local import LocalServiceClient, LocalTrainingClient, _sampling
from shell.local._inputs import check_data, loss_config_key, pack_rows, plan_chunks
from shell.local._train_steps import (
    CHUNKS_PER_CALL,
    lora_logprobs,
    lora_loss_and_grad,
    loss_and_logprob_grad,
    model_forward_vjp,
)
from tests.compile_count import count_compiles
from tests.local.hf_fixtures import (
    hf_config,
    random_hf_tensors,
    train_tokenizer,
    write_hf_directory,
)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = train_tokenizer()
    config = hf_config("llama", vocab_size=len(tokenizer))
    directory = tmp_path_factory.mktemp("llama")
    write_hf_directory(directory, config, random_hf_tensors(config, seed=1), tokenizer)
    return directory


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> LocalServiceClient:
    return LocalServiceClient(seed=0, checkpoint_dir=tmp_path_factory.mktemp("states"))


def _trainer(service: LocalServiceClient, llama_dir: Path, **kwargs: Any) -> LocalTrainingClient:
    return service.create_lora_training_client(base_model=str(llama_dir), rank=4, **kwargs).result()


def _datum(tokens: list[int], advantage: float = 1.0) -> types.Datum:
    n = len(tokens) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(np.asarray(tokens[1:], np.int64)),
            "weights": types.TensorData.from_numpy(np.ones(n, np.float32)),
            "logprobs": types.TensorData.from_numpy(np.full(n, -3.0, np.float32)),
            "advantages": types.TensorData.from_numpy(np.full(n, advantage, np.float32)),
            "sequence_ratio_mask": types.TensorData.from_numpy(np.ones(n, np.float32)),
        },
    )


def _inputs_for(loss_fn: str, datum: types.Datum) -> types.Datum:
    keep = set(LOSSES[loss_fn].required_inputs)
    inputs = {k: v for k, v in datum.loss_fn_inputs.items() if k in keep}
    return types.Datum(model_input=datum.model_input, loss_fn_inputs=inputs)


def _tokens(trainer: LocalTrainingClient, text: str) -> list[int]:
    tokens: list[int] = trainer.get_tokenizer().encode(text, add_special_tokens=False)
    return tokens


def test_step_zero_is_the_base_model_and_only_adapters_train(
    service: LocalServiceClient, llama_dir: Path
) -> None:
    trainer = _trainer(service, llama_dir)
    info = trainer.get_info()
    assert info.is_lora and info.lora_rank == 4
    base = trainer.base_params
    assert base is not None and trainer.lora is not None
    tokens = _tokens(trainer, "The quick brown fox jumps over the lazy dog.")
    datum = _datum(tokens)
    config = trainer.config
    inputs = np.asarray([tokens[:-1]], np.int32)
    targets = np.asarray([tokens[1:]], np.int32)
    base_lp = np.asarray(model_lib.target_logprobs(base, inputs, targets, config=config))[0]
    out = trainer.forward_backward([_inputs_for("cross_entropy", datum)], "cross_entropy")
    lp = out.result().loss_fn_outputs[0]["logprobs"].to_numpy()
    np.testing.assert_allclose(lp, base_lp, atol=1e-5)  # B = 0: step 0 is the base model
    # Tinker's sum reduction: the loss is minus the summed logprobs
    assert out.result().metrics["loss:sum"] == pytest.approx(-float(base_lp.sum()), rel=1e-5)
    adapters_before = trainer.params
    trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert trainer.base_params is base  # shared, never replaced
    changed = [
        not np.array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(
            jax.tree_util.tree_leaves(adapters_before),
            jax.tree_util.tree_leaves(trainer.params),
            strict=True,
        )
    ]
    assert any(changed)
    n_adapter = model_lib.count_lora_params(trainer.params)
    assert n_adapter < model_lib.count_params(base) / 2
    # only adapters in the optimizer state
    assert sum(np.size(x) for x in jax.tree_util.tree_leaves(trainer._opt_state)) <= 3 * n_adapter
    after = trainer.forward([_inputs_for("cross_entropy", datum)], "cross_entropy").result()
    assert after.metrics["loss:sum"] < out.result().metrics["loss:sum"]
    # the sampler samples base + adapters: its prompt logprobs are the trained model's
    sampler = trainer.save_weights_and_get_sampling_client().result()
    prompt_lp = sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
    trained_lp = after.loss_fn_outputs[0]["logprobs"].to_numpy()
    np.testing.assert_allclose(np.asarray(prompt_lp[1:], np.float32), trained_lp, atol=1e-4)


def test_every_loss_runs_through_lora(service: LocalServiceClient, llama_dir: Path) -> None:
    trainer = _trainer(service, llama_dir)
    datum = _datum(_tokens(trainer, "What is 12 + 34? The answer is 46."), advantage=0.5)
    for loss_fn in sorted(LOSSES):
        config = dict.fromkeys(LOSSES[loss_fn].required_config, 0.2)
        out = trainer.forward_backward([_inputs_for(loss_fn, datum)], loss_fn, config).result()  # type: ignore[arg-type]
        assert np.isfinite(out.metrics["loss:sum"]), loss_fn
    assert trainer._grads is not None


def test_lora_forward_backward_equals_the_chain_rule_through_the_logprobs(
    service: LocalServiceClient, llama_dir: Path
) -> None:
    """The one fused LoRA stage against the three-stage route (the toy models' and LoRA's
    before): the VJP of the logprobs applied to the loss's gradient with respect to them. Two
    losses (one with a config) stand for all: the stage is the same for each, and
    `test_every_loss_runs_through_lora` runs every one through it."""
    trainer = _trainer(service, llama_dir)
    tokens = _tokens(trainer, "What is 12 + 34? The answer is 46.")
    warm = _inputs_for("cross_entropy", _datum(tokens))
    trainer.forward_backward([warm], "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()  # B != 0 from here
    adapters, base, config, lora = trainer.params, trainer.base_params, trainer.config, trainer.lora
    assert base is not None and lora is not None
    for loss_fn in ("cross_entropy", "dro"):
        loss_config = dict.fromkeys(LOSSES[loss_fn].required_config, 0.2)
        data = [
            _inputs_for(loss_fn, _datum(tokens[: n + 1], advantage=a))
            for n, a in ((len(tokens) - 1, 0.5), (7, -1.0), (3, 2.0))
        ]
        trainer._grads = None
        with count_compiles() as compiled:
            out = trainer.forward_backward(data, loss_fn, loss_config).result()  # type: ignore[arg-type]
        assert compiled.traces_of(model_forward_vjp) == 0  # LoRA runs its own single stage
        checked = check_data(data, loss_fn, config)
        (chunk,) = plan_chunks(checked.length_D, rows_for_width=lambda width: 8)
        packed = pack_rows(checked, chunk)
        input_D_T = jnp.asarray(packed.input_D_T)
        target_D_T = jnp.asarray(packed.inputs["target_tokens"])
        lp_D_T, vjp = jax.vjp(
            partial(model_lib.target_logprobs_fn, base, input_D_T, target_D_T, config, lora=lora),
            adapters,
        )
        want, dlp_D_T = loss_and_logprob_grad(
            lp_D_T,
            packed.inputs,
            packed.valid_D_T,
            loss_fn=loss_fn,
            loss_config=loss_config_key(loss_config),
            with_grad=True,
        )
        (want_grads,) = vjp(dlp_D_T)
        assert out.metrics["loss:sum"] == pytest.approx(float(want.metrics["loss:sum"]), rel=1e-6)
        for d, (row, n) in enumerate(zip(packed.index_D, packed.length_D, strict=True)):
            np.testing.assert_allclose(
                out.loss_fn_outputs[row]["logprobs"].to_numpy(),
                np.asarray(lp_D_T)[d, :n],
                atol=1e-6,
            )
        got_leaves = jax.tree_util.tree_leaves(trainer._grads)
        want_leaves = jax.tree_util.tree_leaves(want_grads)
        assert any(np.abs(np.asarray(w)).max() > 0 for w in want_leaves), loss_fn
        # float32 sums in another order: compare each leaf at its own scale
        for got, w in zip(got_leaves, want_leaves, strict=True):
            scale = float(np.abs(np.asarray(w)).max())
            np.testing.assert_allclose(np.asarray(got), np.asarray(w), rtol=1e-5, atol=1e-5 * scale)
        # a second call in the same buckets adds its gradient without compiling again
        with count_compiles() as compiled:
            trainer.forward_backward(data, loss_fn, loss_config).result()  # type: ignore[arg-type]
        assert compiled.traces_of(lora_loss_and_grad) == 0
        for got, w in zip(jax.tree_util.tree_leaves(trainer._grads), want_leaves, strict=True):
            scale = float(np.abs(np.asarray(w)).max())
            np.testing.assert_allclose(
                np.asarray(got), 2 * np.asarray(w), rtol=1e-5, atol=2e-5 * scale
            )


def test_save_and_load_state_hold_adapters_only_and_refuse_another_base(
    service: LocalServiceClient, llama_dir: Path, tmp_path: Path
) -> None:
    trainer = _trainer(service, llama_dir)
    datum = _datum(_tokens(trainer, "The quick brown fox"))
    trainer.forward_backward([_inputs_for("cross_entropy", datum)], "cross_entropy")
    trainer.optim_step(types.AdamParams(learning_rate=1e-2))
    path = trainer.save_state("s").result().path
    with np.load(Path(path) / "arrays.npz") as npz:
        names = list(npz.files)
    assert names and all("_a_" in n or "_b_" in n or n.startswith("optimizer") for n in names)
    assert not any(n.endswith("embed_V_E") for n in names)
    resumed = service.create_training_client_from_state_with_optimizer(path).result()
    assert resumed.lora == trainer.lora
    for a, b in zip(
        jax.tree_util.tree_leaves(trainer.params),
        jax.tree_util.tree_leaves(resumed.params),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(CheckpointError, match="LoRA adapters of base model"):
        service.create_training_client_from_state(path, base_model="rlpure/tiny")
    toy = service.create_lora_training_client(base_model="rlpure/tiny").result()
    with pytest.raises(CheckpointError, match="does not match"):
        toy.load_state(path)
    other_rank = _trainer(service, llama_dir, seed=3)
    other_rank._lora = model_lib.LoraConfig(rank=8)
    with pytest.raises(CheckpointError, match="LoRA config"):
        other_rank.load_state(path)
    sampler_path = trainer.save_weights_for_sampler("w").result().path
    sampler = service.create_sampling_client(model_path=sampler_path).result()
    live = trainer.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints(_tokens(trainer, "The quick brown"))
    np.testing.assert_allclose(
        np.asarray(sampler.compute_logprobs(prompt).result()[1:], np.float32),
        np.asarray(live.compute_logprobs(prompt).result()[1:], np.float32),
        atol=1e-6,
    )


def _text(tokenizer: Any, tokens: list[int]) -> str:
    """Decoded text as stop strings see it (special tokens written out, no space clean-up)."""
    return str(
        tokenizer.decode(tokens, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    )


def test_sampling_options(service: LocalServiceClient, llama_dir: Path) -> None:
    trainer = _trainer(service, llama_dir)
    sampler = trainer.save_weights_and_get_sampling_client().result()
    tokenizer = sampler.get_tokenizer()
    assert tokenizer.eos_token_id is not None
    prompt = types.ModelInput.from_ints(_tokens(trainer, "What is 12 + 34?"))
    seeded = types.SamplingParams(max_tokens=8, temperature=1.0, seed=7, stop=[])
    first = sampler.sample(prompt, 4, seeded, include_prompt_logprobs=True).result()
    again = sampler.sample(prompt, 4, seeded).result()
    assert [s.tokens for s in first.sequences] == [s.tokens for s in again.sequences]
    assert all(len(s.tokens) == 8 and s.stop_reason == "length" for s in first.sequences)
    assert first.prompt_logprobs is not None and first.prompt_logprobs[0] is None
    # samples of one request share one prefill but draw independently
    assert len({tuple(s.tokens) for s in first.sequences}) > 1
    greedy = types.SamplingParams(max_tokens=6, temperature=0.0, stop=[])
    g1 = sampler.sample(prompt, 2, greedy).result().sequences
    assert g1[0].tokens == g1[1].tokens
    top1 = types.SamplingParams(max_tokens=6, temperature=1.0, top_k=1, seed=1, stop=[])
    assert sampler.sample(prompt, 1, top1).result().sequences[0].tokens == g1[0].tokens
    stop_id = g1[0].tokens[2]
    by_id = types.SamplingParams(max_tokens=6, temperature=0.0, stop=[stop_id])
    cut = sampler.sample(prompt, 1, by_id).result().sequences[0]
    assert cut.stop_reason == "stop" and cut.tokens[-1] == stop_id
    assert cut.tokens == g1[0].tokens[: len(cut.tokens)]
    # Stop strings end the completion on its decoded text, token that completes them kept.
    # (Seeded draws: a row's stream depends on its seed and step only, so a cut sample is a
    # prefix of the free one; seed 9 draws multi-character tokens from this random model.)
    free = types.SamplingParams(max_tokens=12, temperature=1.0, seed=9, stop=[])
    tokens = sampler.sample(prompt, 1, free).result().sequences[0].tokens
    assert tokenizer.eos_token_id not in tokens  # EOS would end the cut samples first
    pieces = [_text(tokenizer, [t]) for t in tokens]
    # a string that starts inside one token and ends inside the next: its own encoding is
    # not what the model emitted, so only the text check can find it
    at = next(i for i in range(1, len(tokens) - 1) if len(pieces[i]) >= 2 and pieces[i + 1])
    inside = pieces[at][1:] + pieces[at + 1][:1]
    assert tokenizer.encode(inside, add_special_tokens=False) != tokens[at : at + 2]
    for stop in (_text(tokenizer, tokens[1:3]), inside):
        want = next(n for n in range(1, 13) if stop in _text(tokenizer, tokens[:n]))
        by_text = types.SamplingParams(max_tokens=12, temperature=1.0, seed=9, stop=[stop])
        cut_text = sampler.sample(prompt, 1, by_text).result().sequences[0]
        assert cut_text.stop_reason == "stop" and cut_text.tokens == tokens[:want], stop
        assert cut_text.logprobs is not None and len(cut_text.logprobs) == want
    # tempered logprobs: at temperature 1 they equal the model's logprobs of the sample
    seq = first.sequences[0]
    full = types.ModelInput.from_ints(prompt.to_ints() + seq.tokens)
    scored = sampler.compute_logprobs(full).result()[-len(seq.tokens) :]
    assert seq.logprobs is not None
    np.testing.assert_allclose(np.asarray(scored, np.float32), seq.logprobs, atol=1e-4)


def test_lora_chunks_looped_in_one_call_equal_one_call_per_datum(
    service: LocalServiceClient, llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one datum per chunk, a batch of more chunks of one shape than one call loops over
    (plus a shorter shape) gives every datum's logprobs, the summed metrics and the summed
    gradient of one `forward_backward` per datum, and `forward` the same logprobs and loss;
    calls with a different number of chunks of the same shapes compile nothing new."""
    trainer = _trainer(service, llama_dir)
    trainer.forward_backward([_inputs_for("ppo", _datum([1, 2, 3]))], "ppo").result()
    trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()  # B != 0 from here
    monkeypatch.setattr(trainer._runtime, "training_rows", lambda config, width: 1)
    # The datums below share prefixes; this test is about the unshared route's chunk loop
    # (`tests/local/test_prefix_sharing.py` tests the prefix-shared one).
    trainer.prefix_sharing_fraction = 0.0
    tokens = _tokens(trainer, "What is 12 + 34? The answer is 46, and 46 - 34 = 12.")
    rng = np.random.default_rng(0)
    lengths = [len(tokens)] * (CHUNKS_PER_CALL + 3) + [5, 6]  # 19 chunks of one shape, 2 of another
    data = [_inputs_for("ppo", _datum(tokens[:n], advantage=float(rng.normal()))) for n in lengths]
    trainer._grads = None
    together = trainer.forward_backward(data, "ppo").result()
    grads_together = trainer._grads
    want_loss, want_grads = 0.0, None
    for d, datum in enumerate(data):
        trainer._grads = None
        alone = trainer.forward_backward([datum], "ppo").result()
        np.testing.assert_allclose(
            together.loss_fn_outputs[d]["logprobs"].to_numpy(),
            alone.loss_fn_outputs[0]["logprobs"].to_numpy(),
            atol=1e-6,
        )
        want_loss += alone.metrics["loss:sum"]
        want_grads = (
            trainer._grads
            if want_grads is None
            else jax.tree_util.tree_map(jnp.add, want_grads, trainer._grads)
        )
    assert together.metrics["loss:sum"] == pytest.approx(want_loss, rel=1e-5)
    for got, want in zip(
        jax.tree_util.tree_leaves(grads_together),
        jax.tree_util.tree_leaves(want_grads),
        strict=True,
    ):
        scale = float(np.abs(np.asarray(want)).max())
        assert scale > 0
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5 * scale)
    forward = trainer.forward(data, "ppo").result()  # `lora_logprobs` loops over chunks alike
    for d in range(len(data)):
        np.testing.assert_allclose(
            forward.loss_fn_outputs[d]["logprobs"].to_numpy(),
            together.loss_fn_outputs[d]["logprobs"].to_numpy(),
            atol=1e-6,
        )
    assert forward.metrics["loss:sum"] == pytest.approx(together.metrics["loss:sum"], rel=1e-5)
    with count_compiles() as compiled:
        trainer.forward_backward(data[:5] + data[-1:], "ppo").result()
        trainer.forward(data[:5] + data[-1:], "ppo").result()
    assert compiled.traces_of(lora_loss_and_grad) == 0
    assert compiled.traces_of(lora_logprobs) == 0


@pytest.mark.parametrize("shared", [True, False], ids=["common prefix", "nothing shared"])
def test_concurrent_compute_logprobs_are_scored_in_one_call(
    service: LocalServiceClient, llama_dir: Path, monkeypatch: pytest.MonkeyPatch, shared: bool
) -> None:
    """A KL reference scores every datum of a batch at once (`reference_logprobs_D_T`): one
    jitted call for all of them, their common prefix computed once, the values of one request
    at a time (a 2-token and a 1-token sequence among them; `prompt_logprobs_last_n` kept)."""
    sampler = _trainer(service, llama_dir).save_weights_and_get_sampling_client().result()
    rng = np.random.default_rng(4)
    vocab = sampler._config.vocab_size
    head = rng.integers(5, vocab, 40).tolist() if shared else []
    sequences = [head + rng.integers(5, vocab, 3 + i % 5).tolist() for i in range(12)]
    sequences += [sequences[0][:2], sequences[1][:1]]
    alone = [sampler.compute_logprobs(types.ModelInput.from_ints(s)).result() for s in sequences]
    calls = []
    real = lora_logprobs  # the function `_sampling` imported

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(type(args[2]).__name__)
        return real(*args, **kwargs)

    monkeypatch.setattr(_sampling, "lora_logprobs", counting)

    async def together() -> list[list[float | None]]:
        futures = [sampler.compute_logprobs(types.ModelInput.from_ints(s)) for s in sequences]
        last = sampler.compute_logprobs(types.ModelInput.from_ints(sequences[2]), 3)
        return [await f.result_async() for f in [*futures, last]]

    *batched, last_three = asyncio.run(together())
    assert calls == ["GroupedRows" if shared else "ndarray"]
    for x, y in zip(alone, batched, strict=True):
        assert x[0] is None and y[0] is None and len(x) == len(y)
        np.testing.assert_allclose(np.asarray(x[1:], float), np.asarray(y[1:], float), atol=2e-5)
    n = len(sequences[2])
    assert last_three[: n - 3] == [None] * (n - 3)
    np.testing.assert_allclose(
        np.asarray(last_three[n - 3 :], float), np.asarray(alone[2][n - 3 :], float), atol=2e-5
    )
