"""Supervised fine-tuning (SFT): a rendered conversation (or any model input and per-token
weights) as a `cross_entropy` datum, and the mean NLL and bits per byte of a batch.

Conventions:
- Tinker's shifted alignment: a sequence of `N` tokens becomes a datum whose `model_input` is
  its first `N − 1` positions and whose `target_tokens[i]` is token `i + 1`; the weights are
  the renderer's `[N]` weights without their first entry (the first token is never a target).
- `max_length` truncates the full sequence from the right before the shift: a text chunk is
  cut token by token, an image chunk whole; empty text chunks and trailing images are dropped.
  A non-text position's target is 0.
- `reduction="mean"` divides a datum's weights by their sum (a token-mean loss per example;
  unchanged when they sum to 0), `"none"` keeps them (a token-sum loss). The cookbook's SFT
  default is `"mean"`, DPO's `"none"`. The sum is taken in float64 and the quotient rounded
  once: the cookbook sums in float32 with torch, whose summation order follows its CPU kernel,
  so its weights can differ from these in the last bit.
- Metrics read weights as given for the NLL (`−Σ w·lp / Σ w`) and only as a `> 0` mask for
  bits per byte, whose numerator and byte count cover the same tokens: trained and not special
  (the tokenizer's `all_special_ids` or `is_special_token`), bytes counted on each contiguous
  run of them decoded with special tokens kept.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import tinker

from shell.chat import Message, Renderer, TrainOnWhat
from shell.errors import DataValidationError

__all__ = [
    "Reduction",
    "bits_per_byte",
    "conversation_datum",
    "mean_nll",
    "shifted_inputs_and_targets",
    "supervised_datum",
]

Reduction = Literal["none", "mean"]
_IMAGE_CHUNKS = (tinker.types.ImageChunk, tinker.types.ImageAssetPointerChunk)


def _truncated(chunks: list[Any], max_length: int | None) -> list[Any]:
    """`chunks` cut from the right to at most `max_length` positions (a text chunk token by
    token, any other whole), then without empty text chunks and trailing non-text ones."""
    chunks = list(chunks)
    if max_length is not None:
        total = sum(chunk.length for chunk in chunks)
        while total > max_length and chunks:
            last = chunks[-1]
            overflow = total - max_length
            if isinstance(last, tinker.types.EncodedTextChunk) and overflow < last.length:
                chunks[-1] = tinker.types.EncodedTextChunk(tokens=list(last.tokens[:-overflow]))
                total = max_length
            else:
                chunks.pop()
                total -= last.length
    chunks = [
        chunk
        for chunk in chunks
        if not (isinstance(chunk, tinker.types.EncodedTextChunk) and chunk.length == 0)
    ]
    while chunks and isinstance(chunks[-1], _IMAGE_CHUNKS):
        chunks.pop()
    return chunks


def shifted_inputs_and_targets(chunks: Sequence[Any]) -> tuple[tinker.ModelInput, list[int]]:
    """The model input (every position but the last) and the targets (every token but the
    first, 0 at a non-text position) of the full sequence `chunks`.

    Raises:
        DataValidationError: the last chunk is not text, or there are fewer than 2 positions.
    """
    if not chunks or not isinstance(chunks[-1], tinker.types.EncodedTextChunk):
        raise DataValidationError(
            "The last chunk must be a text chunk: a trailing image has no token to predict "
            "after it (drop it before building the datum)"
        )
    if sum(chunk.length for chunk in chunks) < 2:
        raise DataValidationError("need at least 2 tokens for input/target split")
    last = chunks[-1]
    inputs = list(chunks[:-1])
    if last.length > 1:
        inputs.append(tinker.types.EncodedTextChunk(tokens=list(last.tokens[:-1])))
    tokens: list[int] = []
    for chunk in chunks:
        if isinstance(chunk, tinker.types.EncodedTextChunk):
            tokens.extend(int(t) for t in chunk.tokens)
        else:
            tokens.extend([0] * chunk.length)
    return tinker.ModelInput(chunks=inputs), tokens[1:]


def supervised_datum(
    model_input: tinker.ModelInput,
    weights_N: Any,
    *,
    max_length: int | None = None,
    reduction: Reduction = "none",
) -> tinker.Datum:
    """A `cross_entropy` datum of the full sequence `model_input` and its float `[N]` weights
    (numpy, torch or a list), truncated to `max_length` and shifted (module docstring).

    Raises:
        ValueError: an unknown `reduction`.
        DataValidationError: fewer than 2 positions left, or a non-text last chunk.
    """
    if reduction not in ("none", "mean"):
        raise ValueError(f"Unknown reduction mode: {reduction!r}")
    chunks = _truncated(list(model_input.chunks), max_length)
    shifted, targets = shifted_inputs_and_targets(chunks)
    weights = np.asarray(
        weights_N.detach().cpu().numpy() if hasattr(weights_N, "detach") else weights_N,
        np.float32,
    )[1 : len(targets) + 1]
    if reduction == "mean":  # the total in float64: torch's float32 sum order is the CPU's
        total = float(weights.astype(np.float64).sum())
        if total > 0:
            weights = (weights.astype(np.float64) / total).astype(np.float32)
    return tinker.Datum(
        model_input=shifted,
        loss_fn_inputs={
            "weights": tinker.TensorData(
                data=weights.tolist(), dtype="float32", shape=list(weights.shape)
            ),
            "target_tokens": tinker.TensorData(data=targets, dtype="int64", shape=[len(targets)]),
        },
    )


def conversation_datum(
    conversation: list[Message],
    renderer: Renderer,
    max_length: int | None,
    train_on_what: TrainOnWhat | str = TrainOnWhat.ALL_ASSISTANT_MESSAGES,
    reduction: Reduction = "mean",
) -> tinker.Datum:
    """`conversation` rendered by `renderer` (`build_supervised_example`) as a datum
    (`supervised_datum`), weights per `train_on_what`, normalised per `reduction`."""
    model_input, weights_N = renderer.build_supervised_example(
        conversation, train_on_what=train_on_what
    )
    return supervised_datum(model_input, weights_N, max_length=max_length, reduction=reduction)


def mean_nll(
    logprobs_D: Sequence[tinker.TensorData], weights_D: Sequence[tinker.TensorData]
) -> float:
    """`−Σ w·lp / Σ w` over a batch's datums (NaN when the weights sum to 0)."""
    weighted = 0.0
    total = 0.0
    for logprobs, weights in zip(logprobs_D, weights_D, strict=True):
        lp_N, w_N = np.asarray(logprobs.to_numpy(), np.float64), np.asarray(weights.to_numpy())
        weighted += float(lp_N @ w_N)
        total += float(w_N.sum())
    return float("nan") if total == 0 else -weighted / total


def _special_ids(tokenizer: Any) -> frozenset[int]:
    return frozenset(
        int(t) for t in (getattr(tokenizer, "all_special_ids", None) or []) if t is not None
    )


def _is_special(token: int, tokenizer: Any, special: frozenset[int]) -> bool:
    check = getattr(tokenizer, "is_special_token", None)
    return token in special or (callable(check) and bool(check(token)))


def _run_bytes(tokens: list[int], counted: list[bool], tokenizer: Any) -> int:
    """UTF-8 bytes of the counted tokens, each contiguous run decoded on its own."""
    total = 0
    run: list[int] = []
    for token, keep in [*zip(tokens, counted, strict=True), (0, False)]:
        if keep:
            run.append(token)
        elif run:
            text = tokenizer.decode(run, skip_special_tokens=False)
            total += len(("".join(text) if isinstance(text, list) else text).encode("utf-8"))
            run = []
    return total


def bits_per_byte(
    logprobs_D: Sequence[tinker.TensorData],
    weights_D: Sequence[tinker.TensorData],
    target_tokens_D: Sequence[tinker.TensorData],
    tokenizer: Any,
) -> float:
    """`−Σ lp / (ln 2 · bytes)` over the trained, non-special target tokens of a batch, a
    tokenizer-independent NLL (module docstring); NaN when they hold no bytes."""
    special = _special_ids(tokenizer)
    nats = 0.0
    n_bytes = 0
    for logprobs, weights, targets in zip(logprobs_D, weights_D, target_tokens_D, strict=True):
        tokens = [int(t) for t in np.asarray(targets.to_numpy()).reshape(-1)]
        counted = [
            bool(w > 0) and not _is_special(t, tokenizer, special)
            for w, t in zip(np.asarray(weights.to_numpy()).reshape(-1), tokens, strict=True)
        ]
        nats -= float(np.asarray(logprobs.to_numpy(), np.float64)[np.asarray(counted, bool)].sum())
        n_bytes += _run_bytes(tokens, counted, tokenizer)
    return float("nan") if n_bytes == 0 else nats / (math.log(2) * n_bytes)
