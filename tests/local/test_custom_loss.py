"""`forward_backward_custom` and `create_custom_loss` on the local backend, without torch.

The losses themselves run in torch, which this environment does not install: the runs are
tested in `make parity` (`tests/parity/test_custom_loss_parity.py`, against built-in losses and
against the real SDK over `rlpure serve`). Here: the SDK's refusals, the surrogate's datums and
metrics, and the signatures the SDK's callers use.
"""

from __future__ import annotations

import doctest
import importlib.util
import inspect
from typing import Any

import numpy as np
import pytest
import tinker
from tinker import types

from shell.local import LocalServiceClient, LocalTrainingClient, _custom_loss
from shell.local._custom_loss import custom_metrics, forward_data, linear_loss_data

no_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is not None, reason="torch is installed here"
)


def _datum(n: int, **inputs: np.ndarray) -> types.Datum:
    tokens = np.arange(n + 1) % 250
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1].tolist()),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(tokens[1:].astype(np.int64)),
            **{key: types.TensorData.from_numpy(value) for key, value in inputs.items()},
        },
    )


def test_docstring_examples() -> None:
    assert doctest.testmod(_custom_loss).failed == 0


def test_the_forward_pass_reads_targets_and_weights_only_and_zeroes_missing_weights() -> None:
    advantages = np.array([1.0, -2.0, 0.5], np.float32)
    weighted = _datum(3, weights=np.array([0.0, 1.0, 1.0], np.float32), advantages=advantages)
    plain = _datum(2)
    first, second = forward_data([weighted, plain])
    assert set(first.loss_fn_inputs) == set(second.loss_fn_inputs) == {"target_tokens", "weights"}
    assert first.loss_fn_inputs["weights"].data == [0.0, 1.0, 1.0]
    assert second.loss_fn_inputs["weights"].data == [0.0, 0.0]
    assert second.loss_fn_inputs["weights"].dtype == "float32"
    assert first.model_input == weighted.model_input
    missing = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2]),
        loss_fn_inputs={"weights": types.TensorData.from_numpy(np.ones(2, np.float32))},
    )
    with pytest.raises(ValueError, match="target_tokens must be provided"):
        forward_data([plain, missing])


def test_missing_weights_are_zeros_of_the_targets_dense_shape_even_sparse() -> None:
    sparse_targets = types.TensorData(  # (3, 2) top-2 targets, one listed
        data=[7],
        dtype="int64",
        shape=[3, 2],
        sparse_crow_indices=[0, 1, 1, 1],
        sparse_col_indices=[0],
    )
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={"target_tokens": sparse_targets},
    )
    (forward,) = forward_data([datum])
    weights = forward.loss_fn_inputs["weights"]
    assert weights.shape == [3, 2] and weights.to_numpy().shape == (3, 2)
    assert not np.any(weights.to_numpy())


def test_the_backward_pass_weights_are_minus_the_gradient_in_float32() -> None:
    data = [_datum(3, advantages=np.ones(3, np.float32)), _datum(1)]
    grads: list[np.ndarray] = [np.array([0.25, -1.5, 0.0]), np.array([3.0], np.float32)]
    out = linear_loss_data(data, grads)
    assert [d.loss_fn_inputs["weights"].data for d in out] == [[-0.25, 1.5, -0.0], [-3.0]]
    assert {d.loss_fn_inputs["weights"].dtype for d in out} == {"float32"}
    assert all(set(d.loss_fn_inputs) == {"target_tokens", "weights"} for d in out)
    assert out[0].loss_fn_inputs["target_tokens"] == data[0].loss_fn_inputs["target_tokens"]
    with pytest.raises(ValueError):  # one gradient per datum
        linear_loss_data(data, grads[:1])


def test_the_result_reports_the_custom_loss_and_keeps_the_surrogates() -> None:
    metrics = custom_metrics({"loss:sum": -4.0, "other:mean": 1.0}, {"custom/a:sum": 2.0}, 9.5)
    assert metrics == {
        "other:mean": 1.0,
        "custom/a:sum": 2.0,
        "loss:sum": 9.5,
        "surrogate_loss:sum": -4.0,
    }


def test_the_signatures_are_the_sdks() -> None:
    for ours, sdk in (
        (
            LocalTrainingClient.forward_backward_custom,
            tinker.TrainingClient.forward_backward_custom,
        ),
        (LocalServiceClient.create_custom_loss, tinker.ServiceClient.create_custom_loss),
    ):
        ours_params = inspect.signature(ours).parameters
        sdk_params = inspect.signature(sdk).parameters
        assert list(ours_params) == list(sdk_params)
        assert [p.kind for p in ours_params.values()] == [p.kind for p in sdk_params.values()]
        assert [p.default for p in ours_params.values()] == [p.default for p in sdk_params.values()]


def _per_datum_loss(logprobs: Any) -> tuple[Any, dict[str, Any]]:
    return logprobs.sum(), {}


@no_torch
def test_without_torch_both_calls_raise_the_sdks_import_error() -> None:
    service = LocalServiceClient(seed=0, temporary_checkpoints=True)
    trainer = service.create_lora_training_client("rlpure/tiny").result()

    def loss(data: list[types.Datum], logprobs: list[object]) -> tuple[object, dict[str, float]]:
        raise AssertionError("never called")

    with pytest.raises(ImportError, match=r"^PyTorch is not installed\. Cannot run custom"):
        trainer.forward_backward_custom([_datum(3)], loss)
    with pytest.raises(ImportError, match=r"^PyTorch is not installed\. Cannot create a custom"):
        service.create_custom_loss(_per_datum_loss, {"logprobs": 1})
    assert trainer._grads is None  # nothing ran


def test_a_bad_loss_type_input_is_refused_before_anything_runs() -> None:
    trainer = (
        LocalServiceClient(seed=0, temporary_checkpoints=True)
        .create_lora_training_client("rlpure/tiny")
        .result()
    )
    with (
        pytest.warns(DeprecationWarning, match="loss_type_input"),
        pytest.raises(ValueError, match="Unsupported loss_type_input='probs'"),
    ):
        trainer.forward_backward_custom(
            [_datum(2)],
            lambda d, lp: (None, {}),
            loss_type_input="probs",  # type: ignore[arg-type]
        )
    assert trainer._grads is None


def test_forward_backward_with_loss_fn_custom_points_to_forward_backward_custom() -> None:
    trainer = (
        LocalServiceClient(seed=0, temporary_checkpoints=True)
        .create_lora_training_client("rlpure/tiny")
        .result()
    )
    with pytest.raises(NotImplementedError, match="pass the loss to forward_backward_custom"):
        trainer.forward_backward([_datum(2)], "custom")
