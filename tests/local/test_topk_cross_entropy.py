"""`cross_entropy` with `(N, K)` `target_tokens` and `weights` (Tinker's top-K distillation:
`K` targets a position, weighted by a teacher's renormalised probabilities) on the local
backend.

The identity pinned here: one top-K call is the sum of its `K` one-target calls — per-column
logprobs, `loss:sum` and the accumulated gradient — for full fine-tuning and LoRA, unshared and
on both prefix-shared routes (tries, groups), `forward` and `forward_backward`; a call that
mixes `K`s and one-target datums computes each as if alone. Then what is refused, each in one
line naming the datum.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from tinker import types

from shell.local import LocalTrainingClient
from shell.local._inputs import check_data
from tests.local.hf_fixtures import random_llama_trainer, restoring_routes
from tests.local.micro import MICRO_NAME, micro_service

K = 3
ROUTES = {"plain": ("auto", 0.0), "trie": ("trie", 1.0), "grouped": ("grouped", 1.0)}


def _td(array: np.ndarray) -> types.TensorData:
    return types.TensorData.from_numpy(array)


def _topk_data(rng: np.random.Generator, vocab: int, *, groups: int = 2, samples: int = 3) -> list:
    """GRPO-shaped datums (each group's prompt shared) with `(N, K)` soft targets: random ids,
    weights a random distribution over the `K` on the completion, 0 on the prompt."""
    data = []
    for _ in range(groups):
        prompt = rng.integers(1, vocab, size=int(rng.integers(6, 12)))
        for _ in range(samples):
            tokens = np.concatenate([prompt, rng.integers(1, vocab, size=int(rng.integers(2, 6)))])
            n = tokens.size - 1
            weights_N_K = rng.dirichlet(np.ones(K), size=n).astype(np.float32)
            weights_N_K[: prompt.size - 1] = 0.0
            data.append(
                types.Datum(
                    model_input=types.ModelInput.from_ints(tokens[:-1].tolist()),
                    loss_fn_inputs={
                        "target_tokens": _td(rng.integers(0, vocab, size=(n, K))),
                        "weights": _td(weights_N_K),
                    },
                )
            )
    return data


def _column(data: list, k: int) -> list:
    """The datums with column `k` of their targets and weights: `(N,)` one-target datums."""
    return [
        types.Datum(
            model_input=datum.model_input,
            loss_fn_inputs={
                key: _td(np.ascontiguousarray(tensor.to_numpy()[:, k]))
                for key, tensor in datum.loss_fn_inputs.items()
            },
        )
        for datum in data
    ]


def _call(trainer: LocalTrainingClient, data: list, *, backward: bool) -> Any:
    call = trainer.forward_backward if backward else trainer.forward
    return call(data, "cross_entropy").result()


def _assert_sum_of_columns(trainer: LocalTrainingClient, route: str, *, backward: bool) -> None:
    trainer.prefix_route, trainer.prefix_sharing_fraction = ROUTES[route]  # type: ignore[assignment]
    data = _topk_data(np.random.default_rng(7), trainer.config.vocab_size)
    if route != "plain":  # the call really takes the shared route
        (pack,) = (
            p
            for group in trainer._packed_groups(check_data(data, "cross_entropy", trainer.config))
            for p in group
        )
        assert pack.prefix is not None and pack.inputs["weights"].shape[-1] == K
    trainer._grads = None
    top = _call(trainer, data, backward=backward)
    top_grads, trainer._grads = trainer._grads, None
    columns = [_call(trainer, _column(data, k), backward=backward) for k in range(K)]
    summed_grads, trainer._grads = trainer._grads, None
    for d, output in enumerate(top.loss_fn_outputs):
        lp_N_K = output["logprobs"].to_numpy()
        assert lp_N_K.shape == data[d].loss_fn_inputs["target_tokens"].to_numpy().shape
        for k, column in enumerate(columns):
            np.testing.assert_allclose(
                lp_N_K[:, k], column.loss_fn_outputs[d]["logprobs"].to_numpy(), atol=2e-5
            )
    want = sum(column.metrics["loss:sum"] for column in columns)
    assert top.metrics["loss:sum"] == pytest.approx(want, rel=1e-5)
    assert top.metrics["loss:sum"] > 0
    if backward:
        for a, b in zip(
            jax.tree_util.tree_leaves(top_grads),
            jax.tree_util.tree_leaves(summed_grads),
            strict=True,
        ):
            a, b = np.asarray(a), np.asarray(b)  # float32 reassociation, to the leaf's scale
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(b).max()))
        assert any(np.any(np.asarray(leaf) != 0) for leaf in jax.tree_util.tree_leaves(top_grads))


@pytest.fixture(scope="module")
def _lora_of_module(tmp_path_factory: pytest.TempPathFactory) -> LocalTrainingClient:
    trainer = random_llama_trainer(
        tmp_path_factory.mktemp("states"), tmp_path_factory.mktemp("llama")
    )
    # One step so that B ≠ 0 and every adapter matrix gets a gradient.
    data = _topk_data(np.random.default_rng(1), trainer.config.vocab_size)
    trainer.forward_backward(data, "cross_entropy")
    trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    return trainer


@pytest.fixture
def lora(_lora_of_module: LocalTrainingClient) -> Iterator[LocalTrainingClient]:
    yield from restoring_routes(_lora_of_module)


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("backward", [True, False], ids=["forward_backward", "forward"])
def test_full_fine_tuning_top_k_is_the_sum_of_its_columns(
    tmp_path: Path, route: str, backward: bool
) -> None:
    trainer = micro_service(tmp_path).create_lora_training_client(base_model=MICRO_NAME).result()
    _assert_sum_of_columns(trainer, route, backward=backward)


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("backward", [True, False], ids=["forward_backward", "forward"])
def test_lora_top_k_is_the_sum_of_its_columns(
    lora: LocalTrainingClient, route: str, backward: bool
) -> None:
    _assert_sum_of_columns(lora, route, backward=backward)


def test_a_call_may_mix_k_and_one_target_datums(tmp_path: Path) -> None:
    """Datums of `K` = 3, 2 and `(N,)` in one call: each datum's logprobs and the summed
    loss and gradient as when each runs alone (padding columns weigh nothing)."""
    trainer = micro_service(tmp_path).create_lora_training_client(base_model=MICRO_NAME).result()
    three, two, one = _topk_data(np.random.default_rng(9), trainer.config.vocab_size)[:3]
    two = types.Datum(
        model_input=two.model_input,
        loss_fn_inputs={
            key: _td(np.ascontiguousarray(tensor.to_numpy()[:, :2]))
            for key, tensor in two.loss_fn_inputs.items()
        },
    )
    (one,) = _column([one], 1)
    data = [three, one, two]
    mixed = trainer.forward_backward(data, "cross_entropy").result()
    mixed_grads, trainer._grads = trainer._grads, None
    alone = [trainer.forward_backward([datum], "cross_entropy").result() for datum in data]
    alone_grads, trainer._grads = trainer._grads, None
    for datum, got, want in zip(data, mixed.loss_fn_outputs, alone, strict=True):
        lp = got["logprobs"].to_numpy()
        assert lp.shape == datum.loss_fn_inputs["target_tokens"].to_numpy().shape
        np.testing.assert_allclose(lp, want.loss_fn_outputs[0]["logprobs"].to_numpy(), atol=2e-5)
    want_loss = sum(out.metrics["loss:sum"] for out in alone)
    assert mixed.metrics["loss:sum"] == pytest.approx(want_loss, rel=1e-5)
    for a, b in zip(
        jax.tree_util.tree_leaves(mixed_grads), jax.tree_util.tree_leaves(alone_grads), strict=True
    ):
        a, b = np.asarray(a), np.asarray(b)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(b).max()))


def test_sparse_soft_targets_train_as_their_dense_form(tmp_path: Path) -> None:
    trainer = micro_service(tmp_path).create_lora_training_client(base_model=MICRO_NAME).result()
    (dense,) = _topk_data(np.random.default_rng(3), trainer.config.vocab_size, groups=1, samples=1)
    weights_N_K = dense.loss_fn_inputs["weights"].to_numpy()
    rows, cols = np.nonzero(weights_N_K)
    crow = np.searchsorted(rows, np.arange(weights_N_K.shape[0] + 1))
    sparse = types.Datum(
        model_input=dense.model_input,
        loss_fn_inputs={
            "target_tokens": dense.loss_fn_inputs["target_tokens"],
            "weights": types.TensorData(
                data=weights_N_K[rows, cols].tolist(),
                dtype="float32",
                shape=list(weights_N_K.shape),
                sparse_crow_indices=crow.tolist(),
                sparse_col_indices=cols.tolist(),
            ),
        },
    )
    assert rows.size < weights_N_K.size  # the prompt's rows are left out
    want, got = (trainer.forward([datum], "cross_entropy").result() for datum in (dense, sparse))
    assert got.metrics == want.metrics
    np.testing.assert_array_equal(
        got.loss_fn_outputs[0]["logprobs"].to_numpy(),
        want.loss_fn_outputs[0]["logprobs"].to_numpy(),
    )


def test_what_top_k_targets_refuse_is_one_line_naming_the_datum(tmp_path: Path) -> None:
    trainer = micro_service(tmp_path).create_lora_training_client(base_model=MICRO_NAME).result()
    vocab = trainer.config.vocab_size
    good = _topk_data(np.random.default_rng(5), vocab, groups=1, samples=2)
    targets_N_K = good[1].loss_fn_inputs["target_tokens"].to_numpy()
    weights_N_K = good[1].loss_fn_inputs["weights"].to_numpy()
    n = targets_N_K.shape[0]

    def datum(**inputs: np.ndarray) -> types.Datum:
        return types.Datum(
            model_input=good[1].model_input,
            loss_fn_inputs={key: _td(value) for key, value in inputs.items()},
        )

    cases = [
        (
            "ppo",
            datum(
                target_tokens=targets_N_K,
                logprobs=np.zeros(n, np.float32),
                advantages=np.ones(n, np.float32),
            ),
            rf"Datum\[0\]\.loss_fn_inputs\['target_tokens'\]: shape \({n}, {K}\) != model_input "
            rf"shape \({n},\) \(\(N, K\) inputs are target_tokens, weights of cross_entropy only",
        ),
        (
            "cross_entropy",
            datum(target_tokens=targets_N_K, weights=weights_N_K[:, 0].copy()),
            rf"Datum\[1\]\.loss_fn_inputs: shapes differ: target_tokens \({n}, {K}\), "
            rf"weights \({n},\)",
        ),
        (
            "cross_entropy",
            datum(target_tokens=targets_N_K[:, :0], weights=weights_N_K[:, :0]),
            rf"Datum\[1\]\.loss_fn_inputs\['target_tokens'\]: shape \({n}, 0\) != model_input",
        ),
        (
            "cross_entropy",
            datum(
                target_tokens=np.where(np.arange(K) == 2, vocab + 5, targets_N_K),
                weights=weights_N_K,
            ),
            rf"Datum\[1\]\.loss_fn_inputs\['target_tokens'\]: token {vocab + 5} at position 0, "
            rf"column 2 is outside \[0, {vocab}\)",
        ),
    ]
    bad_columns = types.TensorData(  # row 0 lists column 1 twice
        data=[0.5, 0.5],
        dtype="float32",
        shape=[n, K],
        sparse_crow_indices=[0, 2] + [2] * (n - 1),
        sparse_col_indices=[1, 1],
    )
    cases.append(
        (
            "cross_entropy",
            types.Datum(
                model_input=good[1].model_input,
                loss_fn_inputs={"target_tokens": _td(targets_N_K), "weights": bad_columns},
            ),
            r"Datum\[1\]\.loss_fn_inputs\['weights'\]: sparse CSR column indices must increase",
        )
    )
    for loss, bad, message in cases:
        data = [bad] if loss == "ppo" else [good[0], bad]  # Datum[0]: a good one for its loss
        with pytest.raises(ValueError, match=message):
            trainer.forward_backward(data, loss)  # type: ignore[arg-type]
    assert trainer._grads is None  # nothing accumulated by the refused calls
