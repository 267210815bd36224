"""`to_tinker_datums`: equal to the list reference, and identical on the wire to validated datums."""

import numpy as np
import tinker
from hypothesis import given, settings
from hypothesis import strategies as st
from tinker.lib.public_interfaces.training_client import _estimate_datum_bytes_count_proto
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.types.forward_backward_request import ForwardBackwardRequest

from rlpure.packing import assemble_batch
from rlpure.testing import batches
from rlpure.testing.reference import reference_assemble_training_data
from shell.datums import to_tinker_datums


def _request_bytes(datums: list[tinker.Datum]) -> bytes:
    request = ForwardBackwardRequest(
        forward_backward_input=tinker.types.ForwardBackwardInput(
            data=datums, loss_fn="importance_sampling"
        ),
        model_id="model",
        seq_id=1,
    )
    return forward_backward_request_to_proto(request).SerializeToString()


def _advantages(groups_P, data):
    return [[data.draw(st.floats(-2, 2, width=32)) for _ in g.trajectories_G] for g in groups_P]


@settings(max_examples=40, deadline=None)
@given(batches(prefix="mixed", masked_turns=True), st.data())
def test_datums_equal_the_reference_element_for_element(groups_P, data):
    advantages_P = _advantages(groups_P, data)
    batch = assemble_batch(groups_P, advantages_P)
    datums = to_tinker_datums(batch)
    expected = reference_assemble_training_data(groups_P, advantages_P)
    # gspo's `sequence_ratio_mask` (the cookbook sends no mask): the sampled tokens
    for gspo, ref in zip(
        to_tinker_datums(batch, include_mask=False, sequence_ratio_mask=True), expected, strict=True
    ):
        assert set(gspo.loss_fn_inputs) == {"target_tokens", "logprobs", "advantages",
                                            "sequence_ratio_mask"}  # fmt: skip
        mask = gspo.loss_fn_inputs["sequence_ratio_mask"].to_numpy()
        np.testing.assert_array_equal(mask, np.float32(ref["mask"]))
    assert len(datums) == len(expected)
    for datum, ref in zip(datums, expected, strict=True):
        assert datum.model_input.to_ints() == ref["model_input"]
        inputs = datum.loss_fn_inputs
        assert set(inputs) == {"target_tokens", "logprobs", "advantages", "mask"}
        assert inputs["target_tokens"].dtype == "int64"
        assert inputs["target_tokens"].tolist() == ref["target_tokens"]
        for key in ("logprobs", "advantages", "mask"):
            assert inputs[key].dtype == "float32"
            np.testing.assert_array_equal(inputs[key].to_numpy(), np.float32(ref[key]))
        if ref["provenance"] is None:
            assert datum.model_input_spans is None and datum.loss_fn_input_spans is None
        else:
            spans = (datum.model_input_spans or [], datum.loss_fn_input_spans or [])
            assert datum.model_input_spans is not None and datum.loss_fn_input_spans is not None
            got = tuple(
                tuple(
                    (
                        "prompt" if isinstance(s, tinker.PromptProvenanceSpan) else "sampled",
                        s.sequence_id,
                        s.offset + i,
                    )
                    for s in runs
                    for i in range(s.length)
                )
                for runs in spans
            )
            want = tuple(
                tuple((k, q, o + i) for k, q, o, n in runs for i in range(n))
                for runs in ref["provenance"]
            )
            assert got == want


@settings(max_examples=30, deadline=None)
@given(batches(prefix="mixed"), st.data())
def test_fast_datums_serialise_like_validated_datums(groups_P, data):
    batch = assemble_batch(groups_P, _advantages(groups_P, data))
    fast = to_tinker_datums(batch, include_mask=False)
    slow = to_tinker_datums(batch, include_mask=False, validated=True)
    assert _request_bytes(fast) == _request_bytes(slow)
    for f, s in zip(fast, slow, strict=True):
        assert _estimate_datum_bytes_count_proto(f) == _estimate_datum_bytes_count_proto(s)
        # The tokens the fast path holds pass the SDK's own validation unchanged.
        chunk = f.model_input.chunks[0]
        assert isinstance(chunk, tinker.EncodedTextChunk)
        tokens = chunk.tokens
        validated = tinker.ModelInput.model_validate(
            {"chunks": [{"type": "encoded_text", "tokens": [int(t) for t in tokens]}]}
        )
        assert validated == s.model_input
        assert f.model_input.length == s.model_input.length


@settings(max_examples=10, deadline=None)
@given(batches(min_groups=1))
def test_include_mask_false_sends_only_tinker_loss_inputs(groups_P):
    batch = assemble_batch(groups_P, [[1.0] * len(g.trajectories_G) for g in groups_P])
    for datum in to_tinker_datums(batch, include_mask=False):
        assert set(datum.loss_fn_inputs) == {"target_tokens", "logprobs", "advantages"}
