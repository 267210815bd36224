"""`tinker_cookbook.supervised.common`: over `shell.sft`."""

from __future__ import annotations

from typing import Any

import tinker

from shell.sft import (
    Reduction,
    bits_per_byte,
    mean_nll,
    shifted_inputs_and_targets,
    supervised_datum,
)

__all__ = [
    "compute_bpb",
    "compute_mean_nll",
    "create_rightshifted_model_input_and_leftshifted_targets",
    "datum_from_model_input_weights",
]


def compute_mean_nll(
    logprobs_list: list[tinker.TensorData], weights_list: list[tinker.TensorData]
) -> float:
    """`shell.sft.mean_nll`: `−Σ w·lp / Σ w` over the batch."""
    return mean_nll(logprobs_list, weights_list)


def compute_bpb(
    logprobs_list: list[tinker.TensorData],
    weights_list: list[tinker.TensorData],
    target_tokens_list: list[tinker.TensorData],
    tokenizer: Any,
) -> float:
    """`shell.sft.bits_per_byte`."""
    return bits_per_byte(logprobs_list, weights_list, target_tokens_list, tokenizer)


def create_rightshifted_model_input_and_leftshifted_targets(
    chunks: list[tinker.ModelInputChunk],
) -> tuple[tinker.ModelInput, list[int]]:
    """`shell.sft.shifted_inputs_and_targets`."""
    return shifted_inputs_and_targets(chunks)


def datum_from_model_input_weights(
    model_input: tinker.ModelInput,
    weights: Any,
    max_length: int | None = None,
    reduction: Reduction = "none",
) -> tinker.Datum:
    """`shell.sft.supervised_datum`."""
    return supervised_datum(model_input, weights, max_length=max_length, reduction=reduction)
