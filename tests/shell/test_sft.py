"""`shell.sft`: supervised datums and metrics, on hand-computed cases (the cookbook differential
is `tests/parity/test_sft_parity.py`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tinker

from rlpure.model import EOS_ID, ByteTokenizer
from shell.chat import get_renderer
from shell.errors import DataValidationError
from shell.sft import bits_per_byte, conversation_datum, mean_nll, supervised_datum


def _td(values: list[float]) -> tinker.TensorData:
    return tinker.TensorData.from_numpy(np.asarray(values, np.float32))


def test_a_datum_is_the_sequence_shifted_truncated_and_reduced() -> None:
    model_input = tinker.ModelInput.from_ints([1, 2, 3, 4, 5])
    weights = np.array([0, 0, 1, 1, 1], np.float32)
    datum = supervised_datum(model_input, weights)
    assert datum.model_input.to_ints() == [1, 2, 3, 4]
    assert datum.loss_fn_inputs["target_tokens"].data == [2, 3, 4, 5]
    assert datum.loss_fn_inputs["weights"].data == [0.0, 1.0, 1.0, 1.0]
    cut = supervised_datum(model_input, weights, max_length=4, reduction="mean")
    assert cut.model_input.to_ints() == [1, 2, 3]
    assert cut.loss_fn_inputs["target_tokens"].data == [2, 3, 4]
    assert cut.loss_fn_inputs["weights"].data == [0.0, 0.5, 0.5]
    unweighted = supervised_datum(model_input, np.zeros(5), reduction="mean")
    assert unweighted.loss_fn_inputs["weights"].data == [0.0] * 4  # a zero total stays zero


def test_truncation_drops_images_whole_and_targets_them_with_zero() -> None:
    image = tinker.types.ImageChunk(data=b"\x89PNG", format="png", expected_tokens=3)
    text = tinker.types.EncodedTextChunk
    model_input = tinker.ModelInput(chunks=[text(tokens=[7, 8]), image, text(tokens=[9, 10])])
    datum = supervised_datum(model_input, np.ones(7, np.float32))
    assert datum.loss_fn_inputs["target_tokens"].data == [8, 0, 0, 0, 9, 10]
    assert [c.length for c in datum.model_input.chunks] == [2, 3, 1]
    short = supervised_datum(model_input, np.ones(7, np.float32), max_length=4)
    assert short.model_input.to_ints() == [7]  # the image would overflow: dropped whole
    assert short.loss_fn_inputs["target_tokens"].data == [8]


def test_what_cannot_be_a_datum_is_refused_in_one_line() -> None:
    with pytest.raises(DataValidationError, match="at least 2 tokens"):
        supervised_datum(tinker.ModelInput.from_ints([3]), np.ones(1))
    with pytest.raises(ValueError, match="Unknown reduction mode: 'sum'"):
        supervised_datum(tinker.ModelInput.from_ints([3, 4]), np.ones(2), reduction="sum")  # type: ignore[arg-type]


def test_a_conversation_trains_on_its_assistant_turn_with_mean_weights() -> None:
    renderer = get_renderer("role_colon", ByteTokenizer())
    chat = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    datum = conversation_datum(chat, renderer, None)  # type: ignore[arg-type]
    weights = np.asarray(datum.loss_fn_inputs["weights"].data)
    assert weights.sum() == pytest.approx(1.0) and np.count_nonzero(weights) > 0
    trained = np.asarray(datum.loss_fn_inputs["target_tokens"].data)[weights > 0]
    assert ByteTokenizer().decode(trained.tolist()).startswith(" 4")


def test_mean_nll_and_bits_per_byte_by_hand() -> None:
    ln2 = math.log(2)
    logprobs = [_td([-1.0, -ln2, -ln2, -3.0]), _td([-2.0, -ln2])]
    weights = [_td([0.0, 1.0, 1.0, 1.0]), _td([0.0, 1.0])]
    targets = [
        tinker.TensorData.from_numpy(np.array([1, ord("h"), ord("i"), EOS_ID], np.int64)),
        tinker.TensorData.from_numpy(np.array([2, ord("!")], np.int64)),
    ]
    assert mean_nll(logprobs, weights) == pytest.approx((3 * ln2 + 3.0) / 4)
    # EOS is special: out of both sides; "hi" and "!" are 3 bytes for 3 · ln 2 nats
    assert bits_per_byte(logprobs, weights, targets, ByteTokenizer()) == pytest.approx(1.0)
    zero = [_td([0.0] * 4), _td([0.0] * 2)]
    assert math.isnan(mean_nll(logprobs, zero))
    assert math.isnan(bits_per_byte(logprobs, zero, targets, ByteTokenizer()))
