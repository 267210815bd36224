"""`forward_backward_custom` on the local backend, with torch, against built-in losses and
against the real SDK over `rlpure serve`.

- A linear custom loss `−Σ w·lp` trains exactly as the built-in `cross_entropy` with weights
  `w` (outputs, `loss:sum` and the weights after an Adam step, bit for bit), on a toy model
  (full fine-tuning) and on a tiny Llama checkpoint (LoRA).
- A DPO loss over chosen/rejected pairs trains as `cross_entropy` with weights `−∂C/∂lp`
  computed by hand in numpy from the forward logprobs: the custom loss reaches the model
  through its gradient, not through its value.
- `create_custom_loss` gives a handle that runs in this process for its own session's clients
  and is refused by another's; a datum missing an input the handle reads is refused by name.
- The SDK's own client-side `forward_backward_custom` (forward, torch, cross_entropy backward,
  each over HTTP) against `rlpure serve` computes what the in-process client computes, bit
  for bit, with a callable and with a `LossHandle`, across an optimizer step.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="custom losses run in torch (make parity's .cbvenv)")

import jax  # noqa: E402
import tinker  # noqa: E402
from tinker import types  # noqa: E402

from shell.local import LocalServiceClient  # noqa: E402
from tests.parity.tiny_hf_model import write_tiny_llama  # noqa: E402
from tests.serve.server import Server, assert_same_output, running_server, sdk_env  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:DEPRECATED:FutureWarning")

TOY = "rlpure/tiny"
ADAM = types.AdamParams(learning_rate=1e-2)
BETA = 0.5


def _datum(rng: np.random.Generator, n: int, prompt: int) -> types.Datum:
    """`n` positions of random bytes; weight 1 after the first `prompt` positions."""
    tokens = rng.integers(0, 256, n + 1)
    weights = (np.arange(n) >= prompt).astype(np.float32)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1].tolist()),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(tokens[1:].astype(np.int64)),
            "weights": types.TensorData.from_numpy(weights),
        },
    )


def _pairs(seed: int = 0) -> list[types.Datum]:
    """Chosen, rejected, chosen, rejected...: three pairs of different lengths."""
    rng = np.random.default_rng(seed)
    return [_datum(rng, n, prompt=3) for n in (7, 9, 5, 6, 11, 4)]


def _weights(datum: types.Datum) -> Any:
    return datum.loss_fn_inputs["weights"].to_torch()


def linear_loss(data: list[types.Datum], logprobs: list[Any]) -> tuple[Any, dict[str, float]]:
    loss = sum(-(lp * _weights(d)).sum() for d, lp in zip(data, logprobs, strict=True))
    return loss, {"custom/datums:sum": float(len(data))}


def dpo_loss(data: list[types.Datum], logprobs: list[Any]) -> tuple[Any, dict[str, float]]:
    """`−Σ log σ(β (Σ w·lp_chosen − Σ w·lp_rejected))` over consecutive pairs."""
    scores = [(lp * _weights(d)).sum() for d, lp in zip(data, logprobs, strict=True)]
    margins = torch.stack([c - r for c, r in zip(scores[::2], scores[1::2], strict=True)])
    loss = -torch.nn.functional.logsigmoid(BETA * margins).sum()
    accuracy = float((margins > 0).float().mean())
    return loss, {"custom/accuracy:mean": accuracy}


def neg_ll(logprobs: Any, weights: Any) -> tuple[Any, dict[str, Any]]:
    """`linear_loss` per datum, for `create_custom_loss`."""
    loss = -(logprobs * weights).sum()
    return loss, {"custom/neg_ll:sum": loss}


def weighted_by_advantages(logprobs: Any, advantages: Any) -> tuple[Any, dict[str, Any]]:
    return (logprobs * advantages).sum(), {}


def branches_on_a_value(logprobs: Any) -> tuple[Any, dict[str, Any]]:
    """Not a custom loss: it branches on a tensor's value, which torch.fx cannot trace."""
    total = logprobs.sum()
    return (total if total > 0 else -total), {}


def _leaves(tree: Any) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(tree)]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama"))


def _trainer(model: str) -> Any:
    service = LocalServiceClient(seed=0, temporary_checkpoints=True)
    return service.create_lora_training_client(model, rank=4).result()


@pytest.mark.parametrize("which", ["toy", "lora"])
def test_a_linear_custom_loss_trains_as_cross_entropy(which: str, tiny_llama: str) -> None:
    model = TOY if which == "toy" else tiny_llama
    data = _pairs()
    builtin, custom = _trainer(model), _trainer(model)
    want = builtin.forward_backward(data, "cross_entropy").result()
    got = custom.forward_backward_custom(data, linear_loss).result()
    assert got.metrics["loss:sum"] == pytest.approx(want.metrics["loss:sum"], rel=1e-6)
    assert got.metrics["surrogate_loss:sum"] == want.metrics["loss:sum"]
    assert got.metrics["custom/datums:sum"] == len(data)
    for a, b in zip(got.loss_fn_outputs, want.loss_fn_outputs, strict=True):
        np.testing.assert_array_equal(a["logprobs"].to_numpy(), b["logprobs"].to_numpy())
    builtin.optim_step(ADAM).result()
    custom.optim_step(ADAM).result()
    before = _leaves(_trainer(model).params)
    after_builtin, after_custom = _leaves(builtin.params), _leaves(custom.params)
    assert any(not np.array_equal(a, b) for a, b in zip(after_builtin, before, strict=True))
    for a, b in zip(after_custom, after_builtin, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_dpo_loss_trains_on_its_gradient() -> None:
    data = _pairs(seed=1)
    reference, custom = _trainer(TOY), _trainer(TOY)
    forward = reference.forward(data, "cross_entropy").result()
    lp_D = [out["logprobs"].to_numpy().astype(np.float64) for out in forward.loss_fn_outputs]
    w_D = [d.loss_fn_inputs["weights"].to_numpy().astype(np.float64) for d in data]
    scores = np.array([(lp * w).sum() for lp, w in zip(lp_D, w_D, strict=True)])
    margins = scores[::2] - scores[1::2]
    loss = np.logaddexp(0.0, -BETA * margins).sum()  # −Σ log σ(β m)
    slope = BETA / (1.0 + np.exp(BETA * margins))  # −∂loss/∂margin
    grads_D = [(-slope[i // 2] if i % 2 == 0 else slope[i // 2]) * w_D[i] for i in range(len(data))]
    weighted = [
        types.Datum(
            model_input=d.model_input,
            loss_fn_inputs={
                "target_tokens": d.loss_fn_inputs["target_tokens"],
                "weights": types.TensorData.from_numpy((-g).astype(np.float32)),
            },
        )
        for d, g in zip(data, grads_D, strict=True)
    ]
    reference.forward_backward(weighted, "cross_entropy").result()
    got = custom.forward_backward_custom(data, dpo_loss).result()
    assert got.metrics["loss:sum"] == pytest.approx(loss, rel=1e-5)
    assert got.metrics["custom/accuracy:mean"] == pytest.approx(np.mean(margins > 0))
    reference.optim_step(ADAM).result()
    custom.optim_step(ADAM).result()
    for a, b in zip(_leaves(custom.params), _leaves(reference.params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    linear = _trainer(TOY)  # another loss moves the weights elsewhere: the check can fail
    linear.forward_backward_custom(data, linear_loss).result()
    linear.optim_step(ADAM).result()
    assert any(
        not np.allclose(a, b, rtol=1e-5, atol=1e-6)
        for a, b in zip(_leaves(linear.params), _leaves(custom.params), strict=True)
    )


def test_loss_handles_run_in_process_for_their_own_session() -> None:
    data = _pairs()
    service = LocalServiceClient(seed=0, temporary_checkpoints=True)
    handle = service.create_custom_loss(neg_ll, {"logprobs": 1, "weights": 1}).result()
    assert handle.loss_id is None and handle.name == "neg_ll"
    trainer = service.create_lora_training_client(TOY).result()
    got = trainer.forward_backward_custom(data, handle).result()
    want = _trainer(TOY).forward_backward_custom(data, linear_loss).result()
    assert got.metrics["loss:sum"] == pytest.approx(want.metrics["loss:sum"], rel=1e-6)
    assert got.metrics["custom/neg_ll:sum"] == pytest.approx(got.metrics["loss:sum"], rel=1e-6)
    for a, b in zip(got.loss_fn_outputs, want.loss_fn_outputs, strict=True):
        np.testing.assert_array_equal(a["logprobs"].to_numpy(), b["logprobs"].to_numpy())
    with pytest.raises(ValueError, match="was created in session"):
        _trainer(TOY).forward_backward_custom(data, handle)
    advantages = service.create_custom_loss(
        weighted_by_advantages, {"logprobs": 1, "advantages": 1}
    ).result()
    with pytest.raises(ValueError, match=r"datum\[0\] has no loss_fn_inputs\['advantages'\]"):
        trainer.forward_backward_custom(data, advantages)
    with pytest.raises(ValueError, match="cannot be traced"):
        service.create_custom_loss(branches_on_a_value, {"logprobs": 1})


# -- the real SDK over `rlpure serve` --


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("serve-custom") / "state") as served:
        yield served


@pytest.fixture
def sdk(server: Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[tinker.ServiceClient]:
    for name, value in sdk_env(server).items():
        monkeypatch.setenv(name, value)
    client = tinker.ServiceClient()
    yield client
    client.close("success").result()


def _custom_steps(service: Any, use_handle: bool) -> list[Any]:
    """A fresh toy model: forward_backward_custom, optim_step, forward_backward_custom."""
    loss: Any = dpo_loss
    if use_handle:
        loss = service.create_custom_loss(neg_ll, {"logprobs": 1, "weights": 1}).result()
    training = service.create_lora_training_client(TOY, rank=8).result()
    data = _pairs(seed=2)
    first = training.forward_backward_custom(data, loss).result()
    optim = training.optim_step(ADAM).result()
    after = training.forward_backward_custom(data, loss).result()
    return [first, optim, after]


@pytest.mark.parametrize("use_handle", [False, True], ids=["callable", "loss-handle"])
def test_the_sdk_over_serve_computes_what_runs_in_process(
    use_handle: bool, sdk: tinker.ServiceClient, tmp_path: Path
) -> None:
    served = _custom_steps(sdk, use_handle)
    with LocalServiceClient(seed=0, checkpoint_dir=tmp_path / "local") as local:
        in_process = _custom_steps(local, use_handle)
    assert_same_output(served[0], in_process[0])
    assert served[1].metrics == in_process[1].metrics
    assert_same_output(served[2], in_process[2])
    assert served[0].metrics["loss:sum"] != served[2].metrics["loss:sum"]  # the step moved
