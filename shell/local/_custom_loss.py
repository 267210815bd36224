"""`forward_backward_custom` on the local backend: a loss written in torch over each datum's
logprobs, run in this process the way the SDK runs one client-side (SDK 0.38,
`TrainingClient.forward_backward_custom`).

Conventions (the SDK's, step for step):
- A forward pass with the surrogate loss `cross_entropy` on each datum's `target_tokens` and
  `weights` (zeros when absent; the other `loss_fn_inputs` stay with the caller) gives each
  datum's logprobs, shaped as its `target_tokens`.
- The custom loss runs in torch on `(data, logprobs)` (a callable), or per datum with its
  inputs (a client-side `LossHandle`, `ServiceClient.create_custom_loss`); its gradient with
  respect to the logprobs comes from `loss.backward()`.
- A `cross_entropy` forward_backward then runs with `weights = −∂loss/∂logprobs`: Tinker's
  cross_entropy is `−Σ w·lp`, so its gradient is the custom loss's by the chain rule.
- The result is that call's output, with `loss:sum` the custom loss, `surrogate_loss:sum` the
  surrogate's, and the custom loss's metrics added.

torch is imported only here, and only when a custom loss runs (the local backend itself does not
need it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from tinker import types
from tinker.lib.public_interfaces.custom_loss import LossHandle, run_loss_handle

__all__ = [
    "SURROGATE_LOSS",
    "CustomLossFn",
    "custom_loss_gradients",
    "custom_metrics",
    "forward_data",
    "linear_loss_data",
    "require_torch",
]

SURROGATE_LOSS: types.LossFnType = "cross_entropy"

CustomLossFn = Callable[[list[types.Datum], list[Any]], tuple[Any, Mapping[str, float]]]
"""The SDK's `CustomLossFnV1`: `(data, logprobs_list) -> (loss tensor, metrics)`."""


def require_torch(what: str) -> Any:
    """The `torch` module, or the SDK's `ImportError` naming `what` could not run."""
    try:
        import torch
    except ImportError as error:
        raise ImportError(f"PyTorch is not installed. Cannot {what}.") from error
    return torch


def forward_data(data: Sequence[types.Datum]) -> list[types.Datum]:
    """The forward pass's datums: each datum's `target_tokens` and `weights` (zeros when it has
    none), its model input and spans unchanged.

    Raises:
        ValueError: a datum without `target_tokens` (the SDK's message).
    """
    out = []
    for datum in data:
        target_tokens = datum.loss_fn_inputs.get("target_tokens")
        if target_tokens is None:
            raise ValueError("target_tokens must be provided when using cross_entropy")
        weights = datum.loss_fn_inputs.get("weights")
        if weights is None:  # zeros of the targets' dense shape (they may come sparse)
            shape = target_tokens.shape or [len(target_tokens.data)]
            weights = types.TensorData(data=[0.0] * math.prod(shape), dtype="float32", shape=shape)
        out.append(_with_inputs(datum, {"target_tokens": target_tokens, "weights": weights}))
    return out


def linear_loss_data(
    data: Sequence[types.Datum], grads_D: Sequence[np.ndarray]
) -> list[types.Datum]:
    """The backward pass's datums: `target_tokens` and `weights = −grad`, so that
    cross_entropy's `−Σ w·lp` has the custom loss's gradient.

    Examples:
        >>> datum = types.Datum(
        ...     model_input=types.ModelInput.from_ints([1, 2]),
        ...     loss_fn_inputs={"target_tokens": types.TensorData.from_numpy(np.array([2, 3]))},
        ... )
        >>> linear_loss_data([datum], [np.array([0.5, -1.0], np.float32)])[0].loss_fn_inputs[
        ...     "weights"].data
        [-0.5, 1.0]
    """
    return [
        _with_inputs(
            datum,
            {
                "target_tokens": datum.loss_fn_inputs["target_tokens"],
                "weights": types.TensorData.from_numpy(np.negative(grad, dtype=np.float32)),
            },
        )
        for datum, grad in zip(data, grads_D, strict=True)
    ]


def _with_inputs(datum: types.Datum, inputs: dict[str, types.TensorData]) -> types.Datum:
    return types.Datum(
        model_input=datum.model_input,
        loss_fn_inputs=inputs,
        model_input_spans=datum.model_input_spans,
        loss_fn_input_spans=datum.loss_fn_input_spans,
    )


def custom_loss_gradients(
    data: list[types.Datum],
    loss_fn: CustomLossFn | LossHandle,
    forward: types.ForwardBackwardOutput,
) -> tuple[list[np.ndarray], dict[str, float], float]:
    """Runs the custom loss in torch on the forward pass's logprobs: (each datum's
    `∂loss/∂logprobs` as float32 numpy, the loss's metrics, the summed loss value).

    Raises:
        ImportError: torch is not installed.
        ValueError: the loss reached some datum's logprobs with no gradient (the SDK's message).
    """
    torch = require_torch("run custom forward_backward")
    logprobs_D = []
    for out in forward.loss_fn_outputs:
        logprob = torch.tensor(out["logprobs"].data)
        if out["logprobs"].shape is not None:
            logprob = logprob.reshape(out["logprobs"].shape)
        logprobs_D.append(logprob.clone().detach().requires_grad_(True))
    metrics: Mapping[str, Any]
    if isinstance(loss_fn, LossHandle):
        loss, metrics = run_loss_handle(loss_fn, data, logprobs_D)
    else:
        loss, metrics = loss_fn(data, logprobs_D)
    loss_sum = float(loss.detach().sum().item())
    loss.backward()
    grads_D = []
    for logprob in logprobs_D:
        if logprob.grad is None:
            raise ValueError("No gradient computed for logprob tensor")
        grads_D.append(logprob.grad.detach().numpy().astype(np.float32))
    return grads_D, {key: float(value) for key, value in metrics.items()}, loss_sum


def custom_metrics(
    surrogate: Mapping[str, float], loss_metrics: Mapping[str, float], loss_sum: float
) -> dict[str, float]:
    """The result's metrics: the surrogate call's, with its `loss:sum` renamed
    `surrogate_loss:sum`, the custom loss's metrics added, and `loss:sum` the custom loss.

    Examples:
        >>> custom_metrics({"loss:sum": 2.0}, {"custom/m:mean": 0.5}, 7.0)
        {'custom/m:mean': 0.5, 'loss:sum': 7.0, 'surrogate_loss:sum': 2.0}
    """
    metrics = dict(surrogate)
    surrogate_sum = metrics.pop("loss:sum")
    metrics.update(loss_metrics)
    metrics["loss:sum"] = loss_sum
    metrics["surrogate_loss:sum"] = surrogate_sum
    return metrics
