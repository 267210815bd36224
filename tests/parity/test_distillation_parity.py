"""The cookbook's distillation, unchanged, over `rlpure serve`: `cross_entropy` with `(N, K)`
soft targets (Tinker's top-K distillation) and sdft's reverse-KL custom loss over `(N, K)`
logprobs.

A teacher is a LoRA of a tiny Llama fine-tuned through the SDK on a small chat corpus (the
cookbook's `FromConversationFileBuilder` on a local JSON-lines file); the student is the
untrained model.

- The cookbook's `train_off_policy._collect_topk_batch` asks the teacher, over HTTP, for its
  top-K next tokens (`topk_prompt_logprobs`) and builds `(N, K)` datums; the served trainer's
  `loss:sum` is `−Σ w·lp` of the `(N, K)` logprobs it returns (float64 here), and a few steps
  lower it: the student moves toward the teacher.
- sdft's `reverse_kl_custom_loss` on those datums runs through the SDK's own client-side
  `forward_backward_custom` over serve and in process alike, bit for bit, across a step.
- The cookbook's `train_off_policy.main` itself trains over serve with `TINKER_BASE_URL` set:
  every step logged with a finite loss, its final checkpoint recorded. So does
  `train_on_policy.main` on the arithmetic env: the student samples, the teacher scores its
  samples (`compute_logprobs`), and the reverse KL to the teacher is logged at every step.
  And sdft's `main` (self-distillation: the teacher is the model with the answer in context),
  both ways: top-K `cross_entropy` on the teacher's `topk_prompt_logprobs`, and the
  reverse-KL custom loss.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the cookbook's distillation needs torch (.cbvenv)")

import tinker  # noqa: E402
from tinker import types  # noqa: E402

from shell.local import LocalServiceClient  # noqa: E402
from tests.parity.porting import require_cookbook  # noqa: E402
from tests.parity.recipe_runs import (  # noqa: E402
    close_sdk_sessions,
    final_checkpoint,
    jsonl_rows,
    point_sdk_at,
)
from tests.parity.tiny_hf_model import write_tiny_llama  # noqa: E402
from tests.serve.server import Server, assert_same_output, running_server  # noqa: E402

require_cookbook()
from tinker_cookbook.distillation import sdft, train_off_policy, train_on_policy  # noqa: E402
from tinker_cookbook.distillation.datasets import (  # noqa: E402
    DistillationDatasetConfig,
    TeacherConfig,
)
from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDatasetBuilder  # noqa: E402
from tinker_cookbook.recipes.sdft.datasets import SDFTDataset  # noqa: E402
from tinker_cookbook.renderers import get_renderer  # noqa: E402
from tinker_cookbook.supervised.data import FromConversationFileBuilder  # noqa: E402
from tinker_cookbook.tokenizer_utils import get_tokenizer  # noqa: E402

from tests.parity.chat_corpus import common_config, write_sum_chats  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:DEPRECATED:FutureWarning")

K = 4
RANK = 4
BATCH = 4
ADAM = types.AdamParams(learning_rate=2e-2)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sum_chats(tmp_path_factory.mktemp("corpus") / "sums.jsonl")


def _builder(corpus: Path, model: str) -> FromConversationFileBuilder:
    return FromConversationFileBuilder(
        file_path=str(corpus), common_config=common_config(model, batch_size=BATCH)
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("serve-distill") / "state") as served:
        yield served


@pytest.fixture(scope="module", autouse=True)
def _sessions_closed(server: Server) -> Iterator[None]:
    """After the module, before its server stops: the sessions the cookbook left open."""
    yield
    close_sdk_sessions()


@pytest.fixture(scope="module")
def sdk(server: Server) -> Iterator[tinker.ServiceClient]:
    with pytest.MonkeyPatch.context() as patch:
        point_sdk_at(server, patch)
        client = tinker.ServiceClient()
        yield client
        client.close("success").result()


class Teacher:
    """The fine-tuned teacher: its sampler path and a sampling client on it."""

    def __init__(self, path: str, client: Any) -> None:
        self.path, self.client = path, client


@pytest.fixture(scope="module")
def teacher(sdk: tinker.ServiceClient, corpus: Path, tiny_llama: str) -> Teacher:
    """Eight steps of supervised fine-tuning on the corpus, through the SDK."""
    train, _ = _builder(corpus, tiny_llama)()
    training = sdk.create_lora_training_client(tiny_llama, rank=RANK).result()
    for step in range(8):
        training.forward_backward(train.get_batch(step % len(train)), "cross_entropy").result()
        training.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    path = training.save_weights_for_sampler("teacher").result().path
    return Teacher(path, sdk.create_sampling_client(model_path=path).result())


@pytest.fixture(scope="module")
def topk_data(teacher: Teacher, corpus: Path, tiny_llama: str) -> list[types.Datum]:
    """The cookbook's `(N, K)` soft-target datums of the corpus's first batch."""
    train, _ = _builder(corpus, tiny_llama)()
    datums = train.get_batch(0)
    return asyncio.run(
        train_off_policy._collect_topk_batch([teacher.client] * len(datums), datums, K)
    )


def test_cookbook_top_k_datums_train_as_tinker_defines_cross_entropy(
    sdk: tinker.ServiceClient, topk_data: list[types.Datum], tiny_llama: str
) -> None:
    for datum in topk_data:
        n = datum.model_input.length
        assert datum.loss_fn_inputs["target_tokens"].to_numpy().shape == (n, K)
        mass_N = datum.loss_fn_inputs["weights"].to_numpy().sum(axis=1)
        assert np.all((np.abs(mass_N - 1) < 1e-5) | (mass_N == 0)) and mass_N.max() > 0
    student = sdk.create_lora_training_client(tiny_llama, rank=RANK).result()
    _assert_columns_are_one_target_logprobs(
        student.forward(topk_data, "cross_entropy").result(), topk_data, tiny_llama
    )
    losses = []
    for _ in range(4):
        out = student.forward_backward(topk_data, "cross_entropy").result()
        want = -sum(
            float(
                (
                    o["logprobs"].to_numpy().astype(np.float64)
                    * d.loss_fn_inputs["weights"].to_numpy()
                ).sum()
            )
            for o, d in zip(out.loss_fn_outputs, topk_data, strict=True)
        )
        assert out.metrics["loss:sum"] == pytest.approx(want, rel=1e-5)
        losses.append(out.metrics["loss:sum"])
        student.optim_step(ADAM).result()
    assert losses[-1] < 0.9 * losses[0], losses  # toward the teacher's distribution


def _assert_columns_are_one_target_logprobs(
    out: types.ForwardBackwardOutput, data: list[types.Datum], model: str
) -> None:
    """Column `k` of each `(N, K)` output is the logprob of target column `k` alone, as an
    in-process student (LoRA B = 0: the base model) scores it with `(N,)` targets."""
    with LocalServiceClient(seed=0, temporary_checkpoints=True) as local:
        base = local.create_lora_training_client(model, rank=RANK).result()
        for k in range(K):
            column = [
                types.Datum(
                    model_input=d.model_input,
                    loss_fn_inputs={
                        key: types.TensorData.from_numpy(np.ascontiguousarray(t.to_numpy()[:, k]))
                        for key, t in d.loss_fn_inputs.items()
                    },
                )
                for d in data
            ]
            want = base.forward(column, "cross_entropy").result()
            for got_d, want_d in zip(out.loss_fn_outputs, want.loss_fn_outputs, strict=True):
                np.testing.assert_allclose(
                    got_d["logprobs"].to_numpy()[:, k], want_d["logprobs"].to_numpy(), atol=2e-5
                )


def _reverse_kl_steps(service: Any, data: list[types.Datum], model: str) -> list[Any]:
    training = service.create_lora_training_client(model, rank=RANK).result()
    first = training.forward_backward_custom(data, sdft.reverse_kl_custom_loss).result()
    optim = training.optim_step(ADAM).result()
    after = training.forward_backward_custom(data, sdft.reverse_kl_custom_loss).result()
    return [first, optim, after]


def test_sdft_reverse_kl_over_serve_computes_what_runs_in_process(
    server: Server, topk_data: list[types.Datum], tiny_llama: str, tmp_path: Path
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        point_sdk_at(server, patch)
        fresh = tinker.ServiceClient()  # a new session: its first LoRA, as in process
        served = _reverse_kl_steps(fresh, topk_data, tiny_llama)
        fresh.close("success").result()
    with LocalServiceClient(seed=0, checkpoint_dir=tmp_path / "local") as local:
        in_process = _reverse_kl_steps(local, topk_data, tiny_llama)
    assert_same_output(served[0], in_process[0])
    assert served[1].metrics == in_process[1].metrics
    assert_same_output(served[2], in_process[2])
    first, after = served[0].metrics, served[2].metrics
    assert first["loss:sum"] == first["sdft/reverse_kl_loss"]
    assert first["sdft/reverse_kl_positions"] > 0 and first["sdft/reverse_kl_mean"] > 0
    assert after["sdft/reverse_kl_mean"] < first["sdft/reverse_kl_mean"]


def test_the_cookbook_off_policy_distillation_main_trains_over_serve(
    server: Server,
    teacher: Teacher,
    corpus: Path,
    tiny_llama: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    point_sdk_at(server, monkeypatch)
    log_path = tmp_path / "distill"
    config = train_off_policy.Config(
        learning_rate=2e-2,
        dataset_configs=[
            train_off_policy.DatasetWithTeacher(
                dataset_builder=_builder(corpus, tiny_llama),
                teacher_config=TeacherConfig(
                    base_model=tiny_llama, load_checkpoint_path=teacher.path
                ),
            )
        ],
        model_name=tiny_llama,
        recipe_name="distillation-parity",
        renderer_name="role_colon",
        lora_rank=RANK,
        n_teacher_targets=K,
        batch_size=BATCH,
        max_steps=3,
        save_every=0,
        eval_every=0,
        log_path=str(log_path),
    )
    asyncio.run(train_off_policy.main(config))
    rows = [row for row in jsonl_rows(log_path / "metrics.jsonl") if "train/loss:sum" in row]
    assert [row["step"] for row in rows] == [0, 1, 2]
    assert all(math.isfinite(row["train/loss:sum"]) and row["train/loss:sum"] > 0 for row in rows)
    final_checkpoint(log_path)


def test_the_cookbook_on_policy_distillation_main_trains_over_serve(
    server: Server,
    teacher: Teacher,
    tiny_llama: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    point_sdk_at(server, monkeypatch)
    log_path = tmp_path / "on-policy"
    config = train_on_policy.Config(
        learning_rate=1e-2,
        dataset_configs=[
            DistillationDatasetConfig(
                dataset_builder=ArithmeticDatasetBuilder(
                    batch_size=2,
                    model_name_for_tokenizer=tiny_llama,
                    renderer_name="role_colon",
                    n_batches=2,
                    group_size=2,
                ),
                teacher_config=TeacherConfig(
                    base_model=tiny_llama, load_checkpoint_path=teacher.path
                ),
                groups_per_batch=2,
            )
        ],
        model_name=tiny_llama,
        recipe_name="on-policy-distillation-parity",
        renderer_name="role_colon",
        max_tokens=6,
        lora_rank=RANK,
        eval_every=0,
        save_every=0,
        log_path=str(log_path),
    )
    asyncio.run(train_on_policy.main(config))
    rows = [row for row in jsonl_rows(log_path / "metrics.jsonl") if "teacher_kl" in row]
    assert [row["step"] for row in rows] == [0, 1]
    assert all(math.isfinite(row["teacher_kl"]) for row in rows)
    assert any(row["teacher_kl"] != 0 for row in rows)  # the teacher is not the student


@pytest.mark.parametrize("reverse", [False, True], ids=["top-k-cross-entropy", "reverse-kl"])
def test_sdft_main_trains_over_serve(
    reverse: bool, server: Server, tiny_llama: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_sdk_at(server, monkeypatch)
    renderer = get_renderer("role_colon", get_tokenizer(tiny_llama))
    pairs = ((3, 4), (5, 6), (7, 8), (9, 1))
    questions, answers = [f"{a}+{b}=" for a, b in pairs], [str(a + b) for a, b in pairs]
    dataset = SDFTDataset(questions, answers, batch_size=2, group_size=2, renderer=renderer)
    log_path = tmp_path / "sdft"
    config = sdft.Config(
        model_name=tiny_llama,
        recipe_name="sdft-parity",
        renderer_name="role_colon",
        lora_rank=RANK,
        learning_rate=1e-3,
        max_tokens=6,
        topk=K,
        reverse=reverse,
        eval_every=0,
        save_every=0,
        log_path=str(log_path),
    )
    asyncio.run(sdft.main(config, dataset))
    rows = [row for row in jsonl_rows(log_path / "metrics.jsonl") if "sdft/topk" in row]
    assert [row["step"] for row in rows] == [0, 1] and all(row["sdft/topk"] == K for row in rows)
    key = "sdft/total_completion_positions" if reverse else "sdft/total_completion_tokens"
    assert all(row[key] > 0 for row in rows)
    assert all(math.isfinite(row["sdft/mean_teacher_entropy"]) for row in rows)
