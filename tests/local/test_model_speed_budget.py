"""Memory bounds and cheap paths of a pretrained model's training in the local backend.

The issue's GRPO batch on SmolLM2 (128 datums × 128 tokens) went into one jitted training call
(`max_train_tokens` 16,384 allows it), whose backward kept ~2.4 MB of activations per token:
~40 GB, killed on a 24 GB machine. `LocalRuntime.training_rows` now also bounds the activations
a call keeps; the toy models never reach that bound, so their chunking is unchanged. A LoRA
`forward` (no gradient) runs a forward-only executable: the same logprobs as
`forward_backward`'s, with no VJP residuals. The services of one process share a
checkpoint's weights (read once while its files are unchanged).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import jax
import numpy as np
import pytest
from tinker import types

from rlpure import model as model_lib
from shell.local import LocalServiceClient
from shell.local._runtime import activation_floats_per_token
from shell.local._train_steps import lora_logprobs, lora_loss_and_grad
from tests.compile_count import count_compiles
from tests.local.hf_fixtures import (
    hf_config,
    random_hf_tensors,
    train_tokenizer,
    write_hf_directory,
)

SMOLLM2_SHAPE = model_lib.ModelConfig(
    vocab_size=49152,
    d_model=576,
    n_layers=30,
    n_heads=9,
    n_kv_heads=3,
    d_ff=1536,
    max_seq_len=8192,
    family="llama",
    tie_embeddings=True,
)


def test_a_smollm2_training_call_keeps_its_activations_under_4_gib() -> None:
    runtime = LocalServiceClient(seed=0)._runtime
    for width in (128, 256, 384, 1024, 4096):
        rows = runtime.training_rows(SMOLLM2_SHAPE, width)
        floats = rows * width * activation_floats_per_token(SMOLLM2_SHAPE, width)
        assert rows == 1 or 4 * floats <= 4 << 30, (width, rows)
    assert runtime.training_rows(SMOLLM2_SHAPE, 128) == 8  # was 128: ~40 GB


def test_toy_models_chunk_as_before() -> None:
    runtime = LocalServiceClient(seed=0)._runtime
    for name in ("rlpure/tiny", "rlpure/small"):
        config = model_lib.get_model_config(name)
        for width in (16, 128, 1024, 2048):
            old = min(16_384 // width, (1 << 25) // (config.n_heads * width * width))
            assert runtime.training_rows(config, width) == 1 << (old.bit_length() - 1)


@pytest.mark.slow
def test_lora_forward_runs_no_vjp_and_matches_forward_backward(tmp_path: Path) -> None:
    tokenizer = train_tokenizer()
    config = hf_config("llama", vocab_size=len(tokenizer))
    write_hf_directory(tmp_path, config, random_hf_tensors(config, seed=1), tokenizer)
    trainer = (
        LocalServiceClient(seed=0)
        .create_lora_training_client(base_model=str(tmp_path), rank=4)
        .result()
    )
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, len(tokenizer), 12).tolist()
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(np.asarray(tokens[1:], np.int64)),
            "weights": types.TensorData.from_numpy(np.ones(11, np.float32)),
        },
    )
    trainer.forward_backward([datum], "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()  # adapters non-zero
    # Whatever ran earlier in this process: a call to either now traces it anew.
    for jitted in (lora_loss_and_grad, lora_logprobs):
        cast(Any, jitted).clear_cache()  # a jitted function's method (untyped in JitWrapped)
    with count_compiles() as compiled:
        forward = trainer.forward([datum], "cross_entropy").result()
    assert compiled.traces_of(lora_loss_and_grad) == 0
    assert compiled.traces_of(lora_logprobs) == 1
    both = trainer.forward_backward([datum], "cross_entropy").result()
    np.testing.assert_allclose(
        forward.loss_fn_outputs[0]["logprobs"].to_numpy(),
        both.loss_fn_outputs[0]["logprobs"].to_numpy(),
        atol=1e-6,
    )
    assert forward.metrics["loss:sum"] == pytest.approx(both.metrics["loss:sum"], rel=1e-6)
    assert jax.tree_util.tree_leaves(trainer._grads)  # forward_backward still accumulates


def test_services_of_one_process_share_a_checkpoints_weights(tmp_path: Path) -> None:
    tokenizer = train_tokenizer()
    config = hf_config("llama", vocab_size=len(tokenizer))
    write_hf_directory(tmp_path, config, random_hf_tensors(config, seed=2), tokenizer)
    first = LocalServiceClient(seed=0)._runtime.base_model(str(tmp_path))
    second = LocalServiceClient(seed=1)._runtime.base_model(str(tmp_path))
    assert first.params is not None and second.params is first.params  # read once
    write_hf_directory(tmp_path, config, random_hf_tensors(config, seed=3), tokenizer)
    third = LocalServiceClient(seed=0)._runtime.base_model(str(tmp_path))
    assert third.params is not first.params  # the files changed: read again
    changed = [
        not np.array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(
            jax.tree_util.tree_leaves(first.params),
            jax.tree_util.tree_leaves(third.params),
            strict=True,
        )
    ]
    assert any(changed)
