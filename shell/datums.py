"""Padded `rlpure.DatumBatch` → `list[tinker.Datum]`, the form `forward_backward` consumes.

Each datum is built from numpy views of the batch rows: no per-token Python object is made.
`tinker.TensorData.from_numpy` keeps numpy arrays as they are. `model_input` is a pydantic
`tinker.ModelInput`; building it from a list of ints costs one Python int per token plus
pydantic's validation of that list, which together are most of the cookbook's assembly time
(`benchmarks/bench_assembly.py`). The SDK's wire encoder reads chunk tokens with
`np.asarray(tokens, dtype=np.int32).tobytes()`, so by default the text chunk holds the int32
numpy row itself, built with pydantic's `model_construct`. The tokens come from
`rlpure.assemble_batch`, which only holds validated non-negative int32 ids, so nothing is skipped
that could fail. `tests/shell/test_datums.py` checks that these datums serialise to the same request
bytes as fully validated list-based datums, and that their tokens pass the SDK's validation.
Pass `validated=True` for datums built entirely through the SDK's validating constructors
(Python lists of ints), e.g. to hand to code that compares `chunk.tokens` with lists.
"""

from __future__ import annotations

import numpy as np
import tinker

from rlpure.packing import DatumBatch, ProvenanceSpan, check_datum_batch

__all__ = ["to_tinker_datums", "to_tinker_model_input"]


def to_tinker_model_input(tokens: np.ndarray, *, validated: bool = False) -> tinker.ModelInput:
    """A `tinker.ModelInput` holding one text chunk of `tokens` (1-D non-negative int32).

    With `validated=False` the chunk holds the numpy array itself (see the module docstring);
    with `validated=True` it is built by `tinker.ModelInput.from_ints` from a list of ints.
    """
    if validated:
        return tinker.ModelInput.from_ints(tokens.tolist())
    chunk = tinker.EncodedTextChunk.model_construct(tokens=tokens, type="encoded_text")
    return tinker.ModelInput.model_construct(chunks=[chunk])


def to_tinker_datums(
    batch: DatumBatch,
    *,
    include_mask: bool = True,
    sequence_ratio_mask: bool = False,
    validated: bool = False,
) -> list[tinker.Datum]:
    """Converts the real rows of a padded batch to `tinker.Datum`s, in batch order.

    Args:
        batch: a batch from `rlpure.assemble_batch` (numpy or jax arrays).
        include_mask: add the `mask` array to `loss_fn_inputs`, as the cookbook's
            `assemble_training_data` does. Tinker's built-in RL losses take only
            `target_tokens`, `logprobs` and `advantages`, so pass False when sending.
        sequence_ratio_mask: add the mask again as `sequence_ratio_mask`, the input Tinker's
            `gspo` requires (its sequence ratio runs over the sampled tokens).

    Returns:
        `batch.num_datums` datums; datum `d` has `model_input` = the input tokens, and
        `loss_fn_inputs` `target_tokens` (int64), `logprobs`, `advantages` (float32) and
        optionally `mask` and `sequence_ratio_mask` (float32), each of length
        `batch.length_D[d]`.
    """
    check_datum_batch(batch, padding=False)  # padding is never read here
    n = int(batch.num_datums)
    lengths = np.asarray(batch.length_D)[:n].tolist()
    real = (slice(0, n), slice(0, max(lengths, default=0)))  # the columns any datum reads
    input_tokens = np.asarray(batch.input_tokens_D_T, dtype=np.int32)[real]
    # One bulk copy per array: the datums own their loss inputs (the batch's arrays are
    # read-only, and TensorData would otherwise copy each row separately).
    target_tokens = np.array(np.asarray(batch.target_tokens_D_T)[real], dtype=np.int64)
    # One allocation for the three float arrays (fewer, larger blocks page-fault less).
    floats = np.empty((3, *target_tokens.shape), np.float32)
    logprobs, advantages, mask = floats
    sources = (batch.logprobs_D_T, batch.advantages_D_T, batch.mask_D_T)
    for out, source in zip(floats, sources, strict=True):
        np.copyto(out, np.asarray(source)[real], casting="same_kind")
    provenance_D = batch.provenance_D
    tensor = tinker.TensorData  # same object as TensorData.from_numpy, without re-deriving dtype
    datums = []
    for d, length in enumerate(lengths):
        shape = [length]
        inputs = {
            "target_tokens": tensor(data=target_tokens[d, :length], dtype="int64", shape=shape),
            "logprobs": tensor(data=logprobs[d, :length], dtype="float32", shape=shape),
            "advantages": tensor(data=advantages[d, :length], dtype="float32", shape=shape),
        }
        if include_mask:
            inputs["mask"] = tensor(data=mask[d, :length], dtype="float32", shape=shape)
        if sequence_ratio_mask:
            inputs["sequence_ratio_mask"] = tensor(
                data=mask[d, :length], dtype="float32", shape=shape
            )
        datum = tinker.Datum(
            model_input=to_tinker_model_input(input_tokens[d, :length], validated=validated),
            loss_fn_inputs=inputs,
        )
        spans = provenance_D[d] if provenance_D else None
        if spans is not None:
            datum = datum.with_provenance(
                model_input=[_tinker_span(s) for s in spans[0]],
                loss_fn_inputs=[_tinker_span(s) for s in spans[1]],
            )
        datums.append(datum)
    return datums


def _tinker_span(
    span: ProvenanceSpan,
) -> tinker.PromptProvenanceSpan | tinker.SampledProvenanceSpan:
    kind = tinker.PromptProvenanceSpan if span.kind == "prompt" else tinker.SampledProvenanceSpan
    return kind(sequence_id=span.sequence_id, offset=span.offset, length=span.length)
