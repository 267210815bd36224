"""The SDK's protobuf bodies ↔ `tinker.types`, with the SDK's own messages (`tinker.proto`).

Conventions:
- `forward_backward` (and `forward`, the same endpoint with `forward_only`) arrives as a
  `tinker_public.ForwardBackwardRequest`; its result and `asample`'s go back as
  `ForwardBackwardOutput` / `SampleResponse` messages. Everything else is JSON.
- Decoding checks what the SDK could not have produced and raises `WireError` naming the datum,
  the field and the fault: a token buffer or tensor whose byte length is not a whole number of
  elements, a shape that disagrees with the data, an unknown dtype, an image or audio chunk
  (the local models read text). A sparse CSR tensor (torch-built 2-D `target_tokens` or
  `weights`) is densified with 0 for the missing entries, as the SDK's converter does.
- Provenance spans (`stable_reinforce` only, which the local backend refuses) are dropped.
- Encoding writes each output field into one `BatchedTensor` per run of datums whose outputs
  share their trailing shapes (per-datum arrays concatenated, int64 byte offsets, the trailing
  shape of 2-D-or-more fields; an `ArrayRecord` per run) and the metrics
  as they are (`name:reduction` keys); `prompt_logprobs` of a sample response is float32 with
  NaN where the SDK expects `None`, `topk_prompt_logprobs` its `TopkLogprobs` matrices
  (the SDK's empty rows, id 0 and logprob −99999, where it expects `None`) and
  `target_prompt_logprobs` a float32 `Tensor`, dense or sparse CSR as the request was, and
  `prompt_alt_tokens` two dense `Tensor`s (int64 ids, float32 logprobs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import msgspec
import numpy as np
from tinker import types
from tinker.proto import tinker_public_pb2 as pb
from tinker.types.topk_logprobs import TopkLogprobs

from shell.errors import RlpureError
from shell.local._inputs import dense_from_csr

__all__ = [
    "ForwardBackwardCall",
    "WireError",
    "decode_forward_backward",
    "encode_forward_backward_output",
    "encode_sample_response",
]

_DTYPES: Mapping[int, tuple[np.dtype, types.TensorDtype]] = {
    pb.DTYPE_FLOAT32: (np.dtype(np.float32), "float32"),
    pb.DTYPE_INT64: (np.dtype(np.int64), "int64"),
    pb.DTYPE_INT32: (np.dtype(np.int32), "int64"),
}
_OUT_DTYPES: Mapping[str, int] = {"float32": pb.DTYPE_FLOAT32, "int64": pb.DTYPE_INT64}
_OUT_NP: Mapping[str, np.dtype] = {"float32": np.dtype(np.float32), "int64": np.dtype(np.int64)}
_INT32 = np.dtype(np.int32)
_STOP_REASONS: Mapping[str, int] = {
    "stop": pb.STOP_REASON_STOP,
    "length": pb.STOP_REASON_LENGTH,
}


class WireError(RlpureError, ValueError):
    """A protobuf body the server cannot use; the message names the field. `place` is the
    request's `(model_id, seq_id)` when they could be read (a datum was the fault)."""

    def __init__(self, message: str, place: tuple[str, int] | None = None) -> None:
        super().__init__(message)
        self.place = place


class ForwardBackwardCall(msgspec.Struct, frozen=True, kw_only=True):
    """A decoded `ForwardBackwardRequest`."""

    model_id: str
    seq_id: int
    data: tuple[types.Datum, ...]
    loss_fn: str
    loss_fn_config: dict[str, float | str] | None
    forward_only: bool


def _frombuffer(buffer: bytes, dtype: np.dtype, where: str) -> np.ndarray:
    if len(buffer) % dtype.itemsize:
        raise WireError(
            f"{where}: {len(buffer)} bytes is not a whole number of {dtype.name} elements"
        )
    return np.frombuffer(buffer, dtype=dtype).copy()


def _where(index: int, name: str) -> str:
    return f"data[{index}].loss_fn_inputs[{name!r}]"


def _tensor(message: pb.Tensor, index: int, name: str) -> types.TensorData:
    """Loss input `name` of datum `index` (named in errors only: this runs per datum)."""
    code = message.dtype
    if code not in _DTYPES:
        raise WireError(f"{_where(index, name)}: unsupported dtype {code} (float32 or int64)")
    np_dtype, dtype = _DTYPES[code]
    shape = list(message.shape)
    if shape and min(shape) < 0:
        raise WireError(f"{_where(index, name)}: negative shape {shape}")
    if message.HasField("sparse_csr"):
        return _densified(message.sparse_csr, np_dtype, dtype, shape, _where(index, name))
    dense = message.dense
    if len(dense) % np_dtype.itemsize:
        raise WireError(
            f"{_where(index, name)}: {len(dense)} bytes is not a whole number of "
            f"{np_dtype.name} elements"
        )
    values = np.frombuffer(dense, dtype=np_dtype).astype(_OUT_NP[dtype])  # a writable copy
    if shape:
        if math.prod(shape) != values.size:
            raise WireError(
                f"{_where(index, name)}: shape {shape} does not hold {values.size} values"
            )
        values = values.reshape(shape)
    return types.TensorData(data=values, dtype=dtype, shape=list(values.shape))


def _densified(
    csr: pb.SparseCsr, np_dtype: np.dtype, dtype: types.TensorDtype, shape: list[int], where: str
) -> types.TensorData:
    """A sparse CSR tensor as a dense `TensorData` (missing entries 0)."""
    try:
        dense = dense_from_csr(
            _frombuffer(csr.values, np_dtype, f"{where} values").astype(np.dtype(dtype)),
            _frombuffer(csr.crow_indices, np.dtype(np.int64), f"{where} crow_indices"),
            _frombuffer(csr.col_indices, np.dtype(np.int64), f"{where} col_indices"),
            shape,
            fill=0,
            where=where,
        )
    except WireError:
        raise
    except ValueError as err:
        raise WireError(str(err)) from err
    return types.TensorData.from_numpy(dense)


def _datum(message: pb.Datum, index: int) -> types.Datum:
    tokens: list[int] = []
    for position, chunk in enumerate(message.model_input):
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise WireError(
                f"data[{index}].model_input[{position}]: {kind or 'empty'} chunks are not "
                "supported (the local models read text tokens only)"
            )
        tokens.extend(
            _frombuffer(chunk.encoded_text.tokens, _INT32, f"data[{index}] tokens").tolist()
        )
    inputs = {name: _tensor(tensor, index, name) for name, tensor in message.loss_fn_inputs.items()}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens), loss_fn_inputs=inputs)


def _loss_config(message: pb.ForwardBackwardRequest) -> dict[str, float | str] | None:
    config: dict[str, float | str] = {
        key: float(value) for key, value in message.loss_fn_config.items()
    }
    for key, value in message.loss_fn_config_v2.items():  # v2 wins: it also carries strings
        kind = value.WhichOneof("value")
        if kind == "number":
            config[key] = float(value.number)
        elif kind == "text":
            config[key] = value.text
    return config or None


def decode_forward_backward(body: bytes) -> ForwardBackwardCall:
    """The `ForwardBackwardRequest` in `body` as `tinker.types`.

    Raises:
        WireError: not a `ForwardBackwardRequest`, or a datum the server cannot use (the
            message names the datum and field).
    """
    message = pb.ForwardBackwardRequest()
    try:
        message.ParseFromString(body)
    except Exception as err:  # protobuf's DecodeError; the parser raises nothing narrower
        raise WireError(f"body: not a protobuf ForwardBackwardRequest: {err}") from err
    if not message.model_id:
        raise WireError("model_id: missing")
    try:
        data = tuple(_datum(datum, index) for index, datum in enumerate(message.data))
    except WireError as err:
        raise WireError(str(err), (message.model_id, int(message.seq_id))) from err
    return ForwardBackwardCall(
        model_id=message.model_id,
        seq_id=int(message.seq_id),
        data=data,
        loss_fn=message.loss_fn,
        loss_fn_config=_loss_config(message),
        forward_only=bool(message.forward_only),
    )


def _batched(arrays: Sequence[np.ndarray], name: str) -> pb.BatchedTensor:
    dtype = str(arrays[0].dtype) if arrays else "float32"
    if dtype not in _OUT_DTYPES:
        raise ValueError(f"output field {name!r}: dtype {dtype} is neither float32 nor int64")
    trailing = list(arrays[0].shape[1:]) if arrays else []
    sizes = [array.nbytes for array in arrays]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return pb.BatchedTensor(
        data=b"".join(np.ascontiguousarray(array).tobytes() for array in arrays),
        offsets=offsets.tobytes(),
        dtype=_OUT_DTYPES[dtype],  # type: ignore[arg-type]
        trailing_shape=trailing,
    )


def encode_forward_backward_output(output: types.ForwardBackwardOutput) -> bytes:
    """`output` as a serialized `ForwardBackwardOutput` message: one `ArrayRecord` per run of
    consecutive datums whose outputs share their trailing shapes (one for the usual `[N]`
    outputs; `(N, K)` top-K outputs of several `K`s come as several, which the SDK reads in
    order as it reads its server's ragged outputs)."""
    message = pb.ForwardBackwardOutput(
        loss_fn_output_type=output.loss_fn_output_type or "ArrayRecord",
        metrics={key: float(value) for key, value in output.metrics.items()},
    )
    arrays_D = [
        {name: tensor.to_numpy() for name, tensor in datum.items()}
        for datum in output.loss_fn_outputs
    ]
    start = 0
    while start < len(arrays_D):
        trailing = {name: array.shape[1:] for name, array in arrays_D[start].items()}
        end = start + 1
        while end < len(arrays_D) and trailing == {
            name: array.shape[1:] for name, array in arrays_D[end].items()
        }:
            end += 1
        record = pb.ArrayRecord(type_tag="ArrayRecord", num_datums=end - start)
        for name in trailing:
            batch = [arrays[name] for arrays in arrays_D[start:end]]
            record.fields[name].CopyFrom(_batched(batch, name))
        message.loss_fn_outputs.append(record)
        start = end
    return bytes(message.SerializeToString())


def _float32(values: Sequence[float | None]) -> bytes:
    return np.asarray(
        [math.nan if value is None else value for value in values], dtype=np.float32
    ).tobytes()


def encode_sample_response(response: types.SampleResponse) -> bytes:
    """`response` as a serialized `SampleResponse` message."""
    message = pb.SampleResponse()
    for sequence in response.sequences:
        entry = message.sequences.add()
        entry.stop_reason = _STOP_REASONS[sequence.stop_reason]
        entry.tokens = np.asarray(sequence.tokens, dtype=np.int32).tobytes()
        if sequence.logprobs is not None:
            entry.logprobs = _float32(sequence.logprobs)
        if sequence.topk_logprobs_np is not None:
            entry.topk_sampled_logprobs.CopyFrom(_topk(sequence.topk_logprobs_np))
    if response.prompt_logprobs is not None:
        message.prompt_logprobs = _float32(response.prompt_logprobs)
    target = response.target_prompt_logprobs
    if target is not None:
        message.target_prompt_logprobs.CopyFrom(_float32_tensor(target))
    if response.topk_prompt_logprobs_np is not None:
        message.topk_prompt_logprobs.CopyFrom(_topk(response.topk_prompt_logprobs_np))
    alternatives = response.prompt_alt_tokens
    if alternatives is not None:
        message.prompt_alt_tokens.CopyFrom(
            pb.PromptAltTokens(
                tokens=_dense_tensor(alternatives.tokens.to_numpy().astype(np.int64)),
                logprobs=_dense_tensor(alternatives.logprobs.to_numpy().astype(np.float32)),
            )
        )
    return bytes(message.SerializeToString())


def _dense_tensor(array: np.ndarray) -> pb.Tensor:
    """An int64 or float32 array as a dense proto `Tensor`."""
    dtype = pb.DTYPE_INT64 if array.dtype == np.int64 else pb.DTYPE_FLOAT32
    return pb.Tensor(dtype=dtype, shape=list(array.shape), dense=array.tobytes())


def _topk(topk: TopkLogprobs) -> pb.TopkLogprobs:
    """Dense `[length, k]` top-k ids and logprobs as the SDK's proto `TopkLogprobs`."""
    length, k = topk.token_ids.shape
    return pb.TopkLogprobs(
        token_ids=np.ascontiguousarray(topk.token_ids, np.int32).tobytes(),
        logprobs=np.ascontiguousarray(topk.logprobs, np.float32).tobytes(),
        k=k,
        length=length,
    )


def _float32_tensor(tensor: types.TensorData) -> pb.Tensor:
    """A float32 `TensorData` as a proto `Tensor`, dense or sparse CSR as it is."""
    message = pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=list(tensor.shape or []))
    values = np.asarray(tensor.data, np.float32).tobytes()
    if tensor.sparse_crow_indices is None:
        message.dense = values
    else:
        message.sparse_csr.CopyFrom(
            pb.SparseCsr(
                values=values,
                crow_indices=np.asarray(tensor.sparse_crow_indices, np.int64).tobytes(),
                col_indices=np.asarray(tensor.sparse_col_indices or [], np.int64).tobytes(),
            )
        )
    return message
