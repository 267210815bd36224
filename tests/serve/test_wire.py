"""`shell.serve._wire` against the SDK's own protobuf converters (tinker 0.38).

A request the SDK encodes (`tinker.proto.request_conv`, then `forward_only` set the way
`resources/training.py` sets it) decodes to the same datums, loss function and config; the
server's encoded outputs and sample responses decode, with the SDK's `tinker.proto.
response_conv`, to what the server encoded (bit for bit, NaN included; `None` ↔ NaN in
`prompt_logprobs`). Bodies the SDK could not have produced are crafted with
`tinker.proto.tinker_public_pb2` and must raise `WireError` naming the field.

Sparse CSR tensors are checked against a Python-loop densifier (`_csr_dense`), because
`TensorData.to_numpy()` of a sparse tensor needs torch; where torch is installed a test checks
that reference against the SDK's `to_numpy()`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st
from tinker import types
from tinker.proto import request_conv, response_conv
from tinker.proto import tinker_public_pb2 as pb

from shell.serve._wire import (
    WireError,
    decode_forward_backward,
    encode_forward_backward_output,
    encode_sample_response,
)

_INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_FLOAT32 = st.floats(width=32)  # NaN and infinities included: the round trip is bitwise
_TOKEN = st.integers(min_value=0, max_value=2**31 - 1)
_UTF8 = st.text(st.characters(codec="utf-8"), max_size=12)  # protobuf strings
_LOSS_FNS = ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro")


def _csr_dense(tensor: types.TensorData) -> np.ndarray:
    """The dense array of a sparse CSR `TensorData`, 0 where no entry is listed (loops)."""
    assert tensor.shape is not None
    assert tensor.sparse_crow_indices is not None
    assert tensor.sparse_col_indices is not None
    rows, cols = tensor.shape
    values = np.asarray(tensor._numpy).reshape(-1)  # the field request_conv writes
    dense = np.zeros((rows, cols), dtype=values.dtype)
    crow, col = tensor.sparse_crow_indices, tensor.sparse_col_indices
    for row in range(rows):
        for k in range(crow[row], crow[row + 1]):
            dense[row, col[k]] = values[k]
    return dense


def _expected_array(tensor: types.TensorData) -> np.ndarray:
    """What the server should see for `tensor`: dense, in its declared dtype."""
    if tensor.sparse_crow_indices is not None:
        return _csr_dense(tensor)
    return np.asarray(tensor.to_numpy()).reshape(-1 if tensor.shape is None else tensor.shape)


def _assert_same_array(got: types.TensorData, want: np.ndarray, what: str) -> None:
    array = got.to_numpy()
    assert got.dtype == str(want.dtype), what
    assert array.dtype == want.dtype, what
    assert array.shape == want.shape, what
    assert array.tobytes() == want.tobytes(), what  # bitwise: NaN payloads and -0.0 too


@st.composite
def _csr_tensors(draw: st.DrawFn, rows: int, dtype: types.TensorDtype) -> types.TensorData:
    """A sparse CSR `TensorData` of shape `[rows, cols]`, built the way the SDK builds one."""
    cols = draw(st.integers(min_value=1, max_value=6))
    values_strategy = _INT64 if dtype == "int64" else _FLOAT32
    crow, col, values = [0], [], []
    for _ in range(rows):
        listed = draw(st.sets(st.integers(min_value=0, max_value=cols - 1)))
        col += sorted(listed)
        values += [draw(values_strategy) for _ in listed]
        crow.append(len(col))
    return types.TensorData(
        data=np.asarray(values, dtype=np.int64 if dtype == "int64" else np.float32),
        dtype=dtype,
        shape=[rows, cols],
        sparse_crow_indices=crow,
        sparse_col_indices=col,
    )


@st.composite
def _two_d(draw: st.DrawFn, rows: int, dtype: types.TensorDtype) -> types.TensorData:
    """A 2-D `target_tokens` / `weights`: sparse CSR or dense (torch-built datums)."""
    if draw(st.booleans()):
        return draw(_csr_tensors(rows, dtype))
    cols = draw(st.integers(min_value=1, max_value=4))
    np_dtype = np.int64 if dtype == "int64" else np.float32
    values = _INT64 if dtype == "int64" else _FLOAT32
    flat = draw(st.lists(values, min_size=rows * cols, max_size=rows * cols))
    return types.TensorData.from_numpy(np.asarray(flat, dtype=np_dtype).reshape(rows, cols))


@st.composite
def _datums(draw: st.DrawFn) -> types.Datum:
    n = draw(st.integers(min_value=1, max_value=40))
    tokens = draw(st.lists(_TOKEN, min_size=n, max_size=n))
    cut = draw(st.integers(min_value=0, max_value=n))  # one or two text chunks
    chunks: list[types.ModelInputChunk] = [
        types.EncodedTextChunk(tokens=part) for part in (tokens[:cut], tokens[cut:]) if part
    ]
    inputs: dict[str, types.TensorData] = {}
    if draw(st.booleans()):
        inputs["target_tokens"] = draw(_two_d(n, "int64"))
        inputs["weights"] = draw(_two_d(n, "float32"))
    else:
        ints = draw(st.lists(_INT64, min_size=n, max_size=n))
        inputs["target_tokens"] = types.TensorData.from_numpy(np.asarray(ints, dtype=np.int64))
        for name in ("weights", "advantages", "logprobs"):
            floats = draw(st.lists(_FLOAT32, min_size=n, max_size=n))
            inputs[name] = types.TensorData.from_numpy(np.asarray(floats, dtype=np.float32))
    keep = draw(st.sets(st.sampled_from(sorted(inputs)), min_size=1))
    return types.Datum(
        model_input=types.ModelInput(chunks=chunks),
        loss_fn_inputs={name: inputs[name] for name in sorted(keep)},
    )


_CONFIG_VALUES = st.one_of(
    st.floats(allow_nan=False),
    st.integers(min_value=-(2**53), max_value=2**53),
    _UTF8,
)


@st.composite
def _requests(draw: st.DrawFn) -> tuple[types.ForwardBackwardRequest, bool]:
    fb_input = types.ForwardBackwardInput(
        data=draw(st.lists(_datums(), min_size=1, max_size=5)),
        loss_fn=draw(st.sampled_from(_LOSS_FNS)),
        loss_fn_config=draw(
            st.none() | st.dictionaries(_UTF8.filter(bool), _CONFIG_VALUES, max_size=4)
        ),
    )
    request = types.ForwardBackwardRequest(
        forward_backward_input=fb_input,
        model_id=draw(_UTF8.filter(bool)),
        seq_id=draw(st.integers(min_value=0, max_value=2**31 - 1)),
    )
    return request, draw(st.booleans())


def _sdk_body(request: types.ForwardBackwardRequest, *, forward_only: bool = False) -> bytes:
    """The body the SDK posts (`resources/training.py`: convert, then set `forward_only`)."""
    message = request_conv.forward_backward_request_to_proto(request)
    message.forward_only = forward_only
    return bytes(message.SerializeToString())


def _expected_config(config: Mapping[str, float | str] | None) -> dict[str, float | str] | None:
    """Numbers arrive as floats (the SDK writes `float(v)`); an empty config is no config."""
    if not config:
        return None
    return {key: value if isinstance(value, str) else float(value) for key, value in config.items()}


@settings(deadline=None, max_examples=60)
@given(_requests())
def test_decode_inverts_the_sdk_request_encoder(drawn: tuple[types.ForwardBackwardRequest, bool]):
    request, forward_only = drawn
    call = decode_forward_backward(_sdk_body(request, forward_only=forward_only))
    fb_input = request.forward_backward_input
    assert call.model_id == request.model_id
    assert call.seq_id == request.seq_id
    assert call.loss_fn == fb_input.loss_fn
    assert call.loss_fn_config == _expected_config(fb_input.loss_fn_config)
    assert call.forward_only is forward_only
    assert len(call.data) == len(fb_input.data)
    for index, (got, want) in enumerate(zip(call.data, fb_input.data, strict=True)):
        assert got.model_input.to_ints() == want.model_input.to_ints(), index
        assert sorted(got.loss_fn_inputs) == sorted(want.loss_fn_inputs), index
        for name, tensor in want.loss_fn_inputs.items():
            what = f"data[{index}].loss_fn_inputs[{name!r}]"
            _assert_same_array(got.loss_fn_inputs[name], _expected_array(tensor), what)


def test_csr_reference_matches_the_sdk_densifier():
    pytest.importorskip("torch")
    tensor = types.TensorData(
        data=np.asarray([3, -1, 7], dtype=np.int64),
        dtype="int64",
        shape=[3, 4],
        sparse_crow_indices=[0, 2, 2, 3],
        sparse_col_indices=[0, 3, 1],
    )
    np.testing.assert_array_equal(_csr_dense(tensor), tensor.to_numpy())


def test_csr_reference_by_hand():
    tensor = types.TensorData(
        data=np.asarray([0.5, -2.0, 4.0], dtype=np.float32),
        dtype="float32",
        shape=[3, 3],
        sparse_crow_indices=[0, 1, 1, 3],
        sparse_col_indices=[2, 0, 1],
    )
    want = np.asarray([[0, 0, 0.5], [0, 0, 0], [-2.0, 4.0, 0]], dtype=np.float32)
    np.testing.assert_array_equal(_csr_dense(tensor), want)
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=[
                types.Datum(
                    model_input=types.ModelInput.from_ints([1, 2, 3]),
                    loss_fn_inputs={"weights": tensor},
                )
            ],
            loss_fn="cross_entropy",
        ),
        model_id="m",
        seq_id=1,
    )
    call = decode_forward_backward(_sdk_body(request))
    _assert_same_array(call.data[0].loss_fn_inputs["weights"], want, "weights")


def test_strings_in_the_config_survive_only_through_the_v2_map():
    message = pb.ForwardBackwardRequest(model_id="m", loss_fn="cispo")
    message.loss_fn_config["clip"] = 0.2
    message.loss_fn_config["shadowed"] = 1.0
    message.loss_fn_config_v2["shadowed"].number = 2.5
    message.loss_fn_config_v2["mode"].text = "token"
    call = decode_forward_backward(message.SerializeToString())
    assert call.loss_fn_config == {
        "clip": pytest.approx(0.2),
        "shadowed": 2.5,
        "mode": "token",
    }


def test_int32_tensors_widen_to_int64():
    message = pb.ForwardBackwardRequest(model_id="m")
    tensor = message.data.add().loss_fn_inputs["target_tokens"]
    tensor.dtype = pb.DTYPE_INT32
    tensor.shape.append(3)
    tensor.dense = np.asarray([1, -2, 2**31 - 1], dtype=np.int32).tobytes()
    got = decode_forward_backward(message.SerializeToString()).data[0]
    want = np.asarray([1, -2, 2**31 - 1], dtype=np.int64)
    _assert_same_array(got.loss_fn_inputs["target_tokens"], want, "target_tokens")


def test_provenance_spans_are_dropped():
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([5, 6, 7]),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(np.asarray([6, 7, 8], dtype=np.int64))
        },
    ).with_provenance(
        model_input=[types.PromptProvenanceSpan(sequence_id="s", length=3)],
        loss_fn_inputs=[types.SampledProvenanceSpan(sequence_id="s", length=3)],
    )
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[datum], loss_fn="stable_reinforce"),
        model_id="m",
        seq_id=3,
    )
    (got,) = decode_forward_backward(_sdk_body(request)).data
    assert got.model_input.to_ints() == [5, 6, 7]
    assert got.model_input_spans is None
    assert got.loss_fn_input_spans is None


# -- outputs ----------------------------------------------------------------------------


def _assert_same_float(got: float, want: float, what: str) -> None:
    assert (math.isnan(got) and math.isnan(want)) or got == want, (what, got, want)


_METRIC_NAMES = st.sampled_from(
    ["loss:sum", "loss:mean", "clip_fraction:mean", "tokens:sum", "grad_norm:max"]
)


@st.composite
def _outputs(draw: st.DrawFn) -> types.ForwardBackwardOutput:
    lengths = draw(st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=5))
    if draw(st.booleans()):
        lengths[draw(st.integers(min_value=0, max_value=len(lengths) - 1))] = 0
    width = draw(st.integers(min_value=1, max_value=3))
    outputs = []
    for n in lengths:
        logprobs = draw(st.lists(_FLOAT32, min_size=n, max_size=n))
        losses = draw(st.lists(_FLOAT32, min_size=n, max_size=n))
        top = draw(st.lists(_INT64, min_size=n * width, max_size=n * width))
        outputs.append(
            {
                "logprobs": types.TensorData.from_numpy(np.asarray(logprobs, dtype=np.float32)),
                "elementwise_loss": types.TensorData.from_numpy(
                    np.asarray(losses, dtype=np.float32)
                ),
                "top_tokens": types.TensorData.from_numpy(
                    np.asarray(top, dtype=np.int64).reshape(n, width)
                ),
            }
        )
    metrics = draw(st.dictionaries(_METRIC_NAMES, st.floats(), max_size=5))
    return types.ForwardBackwardOutput(
        loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs, metrics=metrics
    )


@settings(deadline=None, max_examples=60)
@given(_outputs())
def test_the_sdk_decodes_forward_backward_outputs_exactly(output: types.ForwardBackwardOutput):
    got = response_conv.deserialize_forward_backward_output(encode_forward_backward_output(output))
    assert got.loss_fn_output_type == "ArrayRecord"
    assert sorted(got.metrics) == sorted(output.metrics)
    for name, value in output.metrics.items():
        _assert_same_float(got.metrics[name], value, name)
    assert len(got.loss_fn_outputs) == len(output.loss_fn_outputs)
    for index, (datum, want) in enumerate(
        zip(got.loss_fn_outputs, output.loss_fn_outputs, strict=True)
    ):
        assert sorted(datum) == sorted(want), index
        for name, tensor in want.items():
            _assert_same_array(datum[name], tensor.to_numpy(), f"[{index}][{name!r}]")


def test_an_empty_forward_backward_output_round_trips():
    output = types.ForwardBackwardOutput(
        loss_fn_output_type="ArrayRecord", loss_fn_outputs=[], metrics={"loss:sum": 0.0}
    )
    got = response_conv.deserialize_forward_backward_output(encode_forward_backward_output(output))
    assert got.loss_fn_outputs == []
    assert got.metrics == {"loss:sum": 0.0}


@st.composite
def _sample_responses(draw: st.DrawFn) -> types.SampleResponse:
    sequences = []
    for index in range(draw(st.integers(min_value=0, max_value=4))):
        n = draw(st.integers(min_value=0, max_value=20))
        tokens = draw(st.lists(_TOKEN, min_size=n, max_size=n))
        logprobs = draw(st.none() | st.lists(_FLOAT32, min_size=n, max_size=n))
        sequences.append(
            types.SampledSequence(
                stop_reason=draw(st.sampled_from(["stop", "length"])),
                sequence_id=f"s{index}",
                tokens_np=np.asarray(tokens, dtype=np.int32),
                logprobs_np=None if logprobs is None else np.asarray(logprobs, dtype=np.float32),
            )
        )
    prompt = draw(
        st.none()
        | st.lists(st.none() | st.floats(width=32, allow_nan=False), min_size=1, max_size=20)
    )
    prompt_np = None
    if prompt is not None:
        prompt[0] = None  # no logprob for the first prompt token
        prompt_np = np.asarray([math.nan if p is None else p for p in prompt], dtype=np.float32)
    return types.SampleResponse(sequences=sequences, prompt_logprobs_np=prompt_np)


@settings(deadline=None, max_examples=60)
@given(_sample_responses())
def test_the_sdk_decodes_sample_responses_exactly(response: types.SampleResponse):
    got = response_conv.deserialize_sample_response(encode_sample_response(response))
    assert len(got.sequences) == len(response.sequences)
    for index, (seq, want) in enumerate(zip(got.sequences, response.sequences, strict=True)):
        assert seq.stop_reason == want.stop_reason, index
        assert seq.tokens == want.tokens, index
        assert seq.tokens_np is not None
        assert seq.tokens_np.dtype == np.int32, index
        if want.logprobs is None or not want.logprobs:
            # proto3 cannot tell empty bytes from unset: the SDK reads an empty list as None
            assert not seq.logprobs, index
        else:
            assert seq.logprobs_np is not None
            assert want.logprobs_np is not None
            assert seq.logprobs_np.dtype == np.float32, index
            assert seq.logprobs_np.tobytes() == want.logprobs_np.tobytes(), index
    assert got.prompt_logprobs == response.prompt_logprobs  # None where the server had None


def test_prompt_logprobs_none_travels_as_nan():
    response = types.SampleResponse(
        sequences=[
            types.SampledSequence(
                stop_reason="length",
                sequence_id="s0",
                tokens_np=np.asarray([4, 5], dtype=np.int32),
                logprobs_np=np.asarray([-0.25, -1.5], dtype=np.float32),
            )
        ],
        prompt_logprobs_np=np.asarray([np.nan, -0.5, np.nan, -2.0], dtype=np.float32),
    )
    message = pb.SampleResponse()
    message.ParseFromString(encode_sample_response(response))
    prompt = np.frombuffer(message.prompt_logprobs, dtype=np.float32)
    assert np.isnan(prompt[[0, 2]]).all()
    assert prompt[[1, 3]].tolist() == [-0.5, -2.0]
    assert message.sequences[0].stop_reason == pb.STOP_REASON_LENGTH
    got = response_conv.deserialize_sample_response(message.SerializeToString())
    assert got.prompt_logprobs == [None, -0.5, None, -2.0]
    assert got.sequences[0].tokens == [4, 5]
    assert got.sequences[0].logprobs == [-0.25, -1.5]


# -- bodies the SDK could not have produced ----------------------------------------------


def _request_with_datum() -> tuple[pb.ForwardBackwardRequest, pb.Datum]:
    message = pb.ForwardBackwardRequest(model_id="m", seq_id=1, loss_fn="cross_entropy")
    message.data.add().model_input.add().encoded_text.tokens = np.arange(
        3, dtype=np.int32
    ).tobytes()
    return message, message.data.add()  # the faulty datum is data[1]


def _tensor(
    datum: pb.Datum, name: str, dtype: int, shape: list[int], dense: bytes = b""
) -> pb.Tensor:
    tensor = datum.loss_fn_inputs[name]
    tensor.dtype = dtype  # type: ignore[assignment]
    tensor.shape.extend(shape)
    tensor.dense = dense
    return tensor


@pytest.mark.parametrize("body", [b"\xff", b"\x07", b"\x0a\x05ab", b"not a protobuf"])
def test_a_body_that_is_not_protobuf(body: bytes):
    with pytest.raises(DecodeError):
        pb.ForwardBackwardRequest().ParseFromString(body)  # the bytes really do not parse
    with pytest.raises(WireError, match=r"^body: not a protobuf ForwardBackwardRequest"):
        decode_forward_backward(body)


def test_an_empty_model_id():
    message = pb.ForwardBackwardRequest(model_id="", seq_id=1, loss_fn="cross_entropy")
    message.data.add().model_input.add().encoded_text.tokens = b"\x01\x00\x00\x00"
    with pytest.raises(WireError, match=r"^model_id: missing"):
        decode_forward_backward(message.SerializeToString())
    with pytest.raises(WireError, match=r"^model_id"):
        decode_forward_backward(b"")  # the empty body parses as an empty message


def test_a_token_buffer_of_five_bytes():
    message, datum = _request_with_datum()
    datum.model_input.add().encoded_text.tokens = b"\x01\x00\x00\x00\x02"
    with pytest.raises(WireError, match=r"^data\[1\] tokens: 5 bytes .* int32"):
        decode_forward_backward(message.SerializeToString())


@pytest.mark.parametrize(
    ("shape", "values"),
    [([3], 2), ([2, 3], 5), ([4], 0), ([0], 1)],
)
def test_a_tensor_whose_shape_disagrees_with_its_data(shape: list[int], values: int):
    message, datum = _request_with_datum()
    dense = np.zeros(values, dtype=np.float32).tobytes()
    _tensor(datum, "weights", pb.DTYPE_FLOAT32, shape, dense)
    pattern = rf"^data\[1\]\.loss_fn_inputs\['weights'\]: shape \[.*\] does not hold {values}"
    with pytest.raises(WireError, match=pattern):
        decode_forward_backward(message.SerializeToString())


def test_a_tensor_whose_bytes_are_not_whole_elements():
    message, datum = _request_with_datum()
    _tensor(datum, "target_tokens", pb.DTYPE_INT64, [1], b"\x00" * 12)
    with pytest.raises(WireError, match=r"^data\[1\]\.loss_fn_inputs\['target_tokens'\]: 12 bytes"):
        decode_forward_backward(message.SerializeToString())


def test_a_negative_shape():
    message, datum = _request_with_datum()
    _tensor(datum, "weights", pb.DTYPE_FLOAT32, [-1])
    with pytest.raises(WireError, match=r"^data\[1\]\.loss_fn_inputs\['weights'\]: negative"):
        decode_forward_backward(message.SerializeToString())


@pytest.mark.parametrize("dtype", [pb.DTYPE_UNSPECIFIED, pb.DTYPE_BFLOAT16, 99])
def test_an_unsupported_dtype(dtype: int):
    message, datum = _request_with_datum()
    _tensor(datum, "advantages", dtype, [2], b"\x00" * 8)
    with pytest.raises(
        WireError, match=rf"^data\[1\]\.loss_fn_inputs\['advantages'\]: unsupported dtype {dtype}"
    ):
        decode_forward_backward(message.SerializeToString())


def test_an_image_chunk_from_the_sdk():
    image = types.ImageChunk(data=b"\x89PNG....", format="png", expected_tokens=4)
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=[
                types.Datum(model_input=types.ModelInput.from_ints([1, 2])),
                types.Datum(
                    model_input=types.ModelInput(
                        chunks=[types.EncodedTextChunk(tokens=[1, 2]), image]
                    )
                ),
            ],
            loss_fn="cross_entropy",
        ),
        model_id="m",
        seq_id=1,
    )
    with pytest.raises(WireError, match=r"^data\[1\]\.model_input\[1\]: image chunks"):
        decode_forward_backward(_sdk_body(request))


@pytest.mark.parametrize("kind", ["dmel", "empty"])
def test_other_non_text_chunks(kind: str):
    message, datum = _request_with_datum()
    chunk = datum.model_input.add()
    if kind == "dmel":
        chunk.dmel.dmel = b"\x00\x01"
    with pytest.raises(WireError, match=rf"^data\[1\]\.model_input\[0\]: {kind} chunks"):
        decode_forward_backward(message.SerializeToString())


class _Csr(NamedTuple):
    shape: list[int]
    crow: list[int]
    col: list[int]
    values: list[float]


_GOOD_CSR = _Csr(shape=[2, 3], crow=[0, 1, 2], col=[2, 0], values=[1.5, -2.0])


def _request_with_csr(csr: _Csr) -> bytes:
    message, datum = _request_with_datum()
    tensor = _tensor(datum, "weights", pb.DTYPE_FLOAT32, csr.shape)
    tensor.ClearField("dense")
    tensor.sparse_csr.values = np.asarray(csr.values, dtype=np.float32).tobytes()
    tensor.sparse_csr.crow_indices = np.asarray(csr.crow, dtype=np.int64).tobytes()
    tensor.sparse_csr.col_indices = np.asarray(csr.col, dtype=np.int64).tobytes()
    return bytes(message.SerializeToString())


def test_the_good_csr_of_the_fault_table_decodes():
    got = decode_forward_backward(_request_with_csr(_GOOD_CSR)).data[1]
    want = np.asarray([[0, 0, 1.5], [-2.0, 0, 0]], dtype=np.float32)
    _assert_same_array(got.loss_fn_inputs["weights"], want, "weights")


@pytest.mark.parametrize(
    "csr",
    [
        _GOOD_CSR._replace(crow=[0, 2]),  # rows + 1 pointers expected
        _GOOD_CSR._replace(crow=[0, 1, 2, 2]),
        _GOOD_CSR._replace(crow=[1, 1, 2]),  # must start at 0
        _GOOD_CSR._replace(crow=[0, 1, 3]),  # must end at the number of values
        _GOOD_CSR._replace(crow=[0, 3, 2]),  # decreasing
        _GOOD_CSR._replace(col=[2]),  # one column per value
        _GOOD_CSR._replace(col=[3, 0]),  # out of range
        _GOOD_CSR._replace(col=[-1, 0]),
        _GOOD_CSR._replace(shape=[6]),  # CSR needs 2-D
        _GOOD_CSR._replace(shape=[1, 2, 3]),
    ],
)
def test_inconsistent_csr_indices(csr: _Csr):
    with pytest.raises(WireError, match=r"^data\[1\]\.loss_fn_inputs\['weights'\]: .*sparse CSR"):
        decode_forward_backward(_request_with_csr(csr))


def test_csr_index_buffers_must_be_whole_int64s():
    message, datum = _request_with_datum()
    tensor = _tensor(datum, "weights", pb.DTYPE_FLOAT32, [1, 1])
    tensor.sparse_csr.values = np.ones(1, dtype=np.float32).tobytes()
    tensor.sparse_csr.crow_indices = b"\x00" * 12
    tensor.sparse_csr.col_indices = np.zeros(1, dtype=np.int64).tobytes()
    with pytest.raises(WireError, match=r"crow_indices: 12 bytes"):
        decode_forward_backward(message.SerializeToString())
