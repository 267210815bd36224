"""`shell.cookbook.supervised` (over `shell.sft`) against tinker-cookbook 0.6.1's
`supervised.common` and `supervised.data`, and the cookbook's `recipes/sl_loop.py` ported.

- `datum_from_model_input_weights`: random sequences and weights, with and without
  `max_length` (shorter and longer than the sequence), both reductions: the same datum, token
  for token and weight for weight (bit for bit, but `reduction="mean"`'s weights: to a float32
  ulp, `shell.sft`'s deliberate difference); the same refusals.
- `conversation_to_datum`: multi-turn chats rendered by `role_colon` (the byte tokenizer) and
  `qwen3` (a BPE with Qwen's chat tokens), every `TrainOnWhat` mode the renderers share, both
  reductions: the same datum.
- `compute_mean_nll` and `compute_bpb` on random logprobs: the cookbook's values (it sums in
  float32 with torch, here in float64: equal to 1e-6), special tokens left out of both sides of
  bits per byte.
- `recipes/sl_loop.py`, ported by the rule alone, run as `__main__` against `rlpure serve`: two
  steps of its own loop on a local `HuggingFaceH4/no_robots` folder, logged with finite
  `train_mean_nll` and `train_mean_bpb`, its final checkpoint recorded.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the cookbook's supervised helpers need torch")

import tinker  # noqa: E402

from shell.cookbook import renderers as our_renderers  # noqa: E402
from shell.cookbook import tokenizer_utils as our_tokenizers  # noqa: E402
from shell.cookbook.renderers import Message  # noqa: E402
from shell.cookbook.supervised import common as ours  # noqa: E402
from shell.cookbook.supervised import data as our_data  # noqa: E402
from tests.parity.porting import require_cookbook  # noqa: E402
from tests.parity.recipe_runs import (  # noqa: E402
    close_sdk_sessions,
    jsonl_rows,
    point_sdk_at,
    run_ported_main,
    write_local_dataset,
)
from tests.parity.tiny_chat_model import write_tiny_chat_llama  # noqa: E402
from tests.parity.tiny_hf_model import write_tiny_llama  # noqa: E402
from tests.serve.server import Server, running_server  # noqa: E402

require_cookbook()
from tinker_cookbook import renderers as cb_renderers  # noqa: E402
from tinker_cookbook import tokenizer_utils as cb_tokenizers  # noqa: E402
from tinker_cookbook.supervised import common as cb  # noqa: E402
from tinker_cookbook.supervised import data as cb_data  # noqa: E402

CHATS: list[list[Message]] = [
    [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
    ],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "7, the lucky one."},
        {"role": "user", "content": "Another?"},
        {"role": "assistant", "content": "11 ✓"},
    ],
]


def _same_datum(got: tinker.Datum, want: tinker.Datum, reduction: str = "none") -> None:
    """Equal datums; with `reduction="mean"` the weights to a float32 ulp (the module's
    deliberate difference: the total summed in float64, not in torch's float32 order)."""
    assert got.model_input.to_ints() == want.model_input.to_ints()
    assert set(got.loss_fn_inputs) == set(want.loss_fn_inputs)
    for key, tensor in want.loss_fn_inputs.items():
        mine = got.loss_fn_inputs[key]
        assert mine.dtype == tensor.dtype and list(mine.shape or []) == list(tensor.shape or [])
        if key == "weights" and reduction == "mean":
            np.testing.assert_allclose(mine.to_numpy(), tensor.to_numpy(), rtol=2.4e-7, atol=0)
            np.testing.assert_array_equal(mine.to_numpy() == 0, tensor.to_numpy() == 0)
        else:
            np.testing.assert_array_equal(mine.to_numpy(), tensor.to_numpy(), err_msg=key)


@pytest.mark.parametrize("seed", range(6))
def test_datum_from_model_input_weights_is_the_cookbooks(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 40))
    model_input = tinker.ModelInput.from_ints(rng.integers(0, 500, n).tolist())
    weights_N = rng.random(n).astype(np.float32) * (rng.random(n) > 0.3)
    for max_length in (None, n, n + 5, max(2, n // 2)):
        for reduction in ("none", "mean"):
            want = cb.datum_from_model_input_weights(
                model_input, torch.from_numpy(weights_N), max_length, reduction=reduction
            )
            got = ours.datum_from_model_input_weights(
                model_input, weights_N, max_length, reduction=reduction
            )
            _same_datum(got, want, reduction)


def test_the_same_inputs_are_refused() -> None:
    one = tinker.ModelInput.from_ints([5])
    for module in (cb, ours):
        with pytest.raises(Exception, match="at least 2 tokens"):
            module.datum_from_model_input_weights(one, torch.ones(1))
        with pytest.raises(ValueError, match="Unknown reduction mode: 'sum'"):
            module.datum_from_model_input_weights(
                tinker.ModelInput.from_ints([1, 2]), torch.ones(2), reduction="sum"
            )


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Renderer name → a local model directory whose tokenizer it renders with."""
    root = tmp_path_factory.mktemp("models")
    corpus = [str(message["content"]) for chat in CHATS for message in chat] * 5
    return {
        "role_colon": str(write_tiny_llama(root / "tiny-llama")),
        "qwen3": str(write_tiny_chat_llama(root / "tiny-chat-llama", corpus)),
    }


MODES = ["all_assistant_messages", "last_assistant_message", "all_messages", "all_tokens"]


@pytest.mark.parametrize("renderer_name", ["role_colon", "qwen3"])
def test_conversation_to_datum_is_the_cookbooks(renderer_name: str, models: dict[str, str]) -> None:
    model = models[renderer_name]
    cb_renderer = cb_renderers.get_renderer(renderer_name, cb_tokenizers.get_tokenizer(model))
    our_renderer = our_renderers.get_renderer(renderer_name, our_tokenizers.get_tokenizer(model))
    for chat in CHATS:
        for mode in MODES:
            for reduction in ("none", "mean"):
                for max_length in (None, 12):
                    want = cb_data.conversation_to_datum(
                        chat, cb_renderer, max_length, cb_renderers.TrainOnWhat(mode), reduction
                    )
                    got = our_data.conversation_to_datum(
                        chat, our_renderer, max_length, our_renderers.TrainOnWhat(mode), reduction
                    )
                    _same_datum(got, want, reduction)


def _td(array: np.ndarray) -> tinker.TensorData:
    return tinker.TensorData.from_numpy(array)


@pytest.mark.parametrize("renderer_name", ["role_colon", "qwen3"])
def test_mean_nll_and_bits_per_byte_are_the_cookbooks(
    renderer_name: str, models: dict[str, str]
) -> None:
    tokenizer = cb_tokenizers.get_tokenizer(models[renderer_name])
    renderer = cb_renderers.get_renderer(renderer_name, tokenizer)
    data = [cb_data.conversation_to_datum(chat, renderer, None) for chat in CHATS]
    rng = np.random.default_rng(3)
    logprobs = [_td(-rng.exponential(2.0, d.model_input.length).astype(np.float32)) for d in data]
    weights = [d.loss_fn_inputs["weights"] for d in data]
    targets = [d.loss_fn_inputs["target_tokens"] for d in data]
    want_nll = cb.compute_mean_nll(logprobs, weights)
    assert ours.compute_mean_nll(logprobs, weights) == pytest.approx(want_nll, rel=1e-6)
    want_bpb = cb.compute_bpb(logprobs, weights, targets, tokenizer)
    our_tokenizer = our_tokenizers.get_tokenizer(models[renderer_name])
    got_bpb = ours.compute_bpb(logprobs, weights, targets, our_tokenizer)
    assert got_bpb == pytest.approx(want_bpb, rel=1e-6) and math.isfinite(got_bpb)
    zero = [_td(np.zeros(w.to_numpy().shape, np.float32)) for w in weights]
    assert math.isnan(ours.compute_mean_nll(logprobs, zero)) and math.isnan(
        ours.compute_bpb(logprobs, zero, targets, our_tokenizer)
    )


# -- the recipe --


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("serve-sl") / "state") as running:
        yield running


@pytest.fixture(scope="module", autouse=True)
def _sessions_closed(server: Server) -> Iterator[None]:
    """After the module, before its server stops: the sessions the cookbook left open."""
    yield
    close_sdk_sessions()


def test_sl_loop_ported_trains_over_serve(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_sdk_at(server, monkeypatch)
    rows: list[dict[str, Any]] = [{"messages": chat} for chat in CHATS * 4]
    write_local_dataset(tmp_path, "HuggingFaceH4/no_robots", {"default": {"train": rows}})
    monkeypatch.chdir(tmp_path)  # the dataset's name is a folder here
    log_path = tmp_path / "run"
    run_ported_main(
        "recipes/sl_loop.py",
        [
            "model_name=rlpure/tiny",
            "batch_size=4",
            "max_steps=2",
            "save_every=0",
            "learning_rate=1e-2",
            f"log_path={log_path}",
        ],
        monkeypatch=monkeypatch,
    )
    steps = [row for row in jsonl_rows(log_path / "metrics.jsonl") if "train_mean_nll" in row]
    assert [row["step"] for row in steps] == [0, 1]
    for row in steps:
        assert math.isfinite(row["train_mean_nll"]) and math.isfinite(row["train_mean_bpb"])
        assert row["num_sequences"] == 4
    (final,) = jsonl_rows(log_path / "checkpoints.jsonl")
    assert final["name"] == "final" and final["state_path"].startswith("tinker://")
