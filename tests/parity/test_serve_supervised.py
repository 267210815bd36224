"""The cookbook's supervised fine-tuning and DPO, unchanged, over `rlpure serve`.

tinker-cookbook 0.6.1 runs as installed, pointed at the server by the environment alone
(`TINKER_BASE_URL`, a `tml-` key, telemetry off, the hub offline), on a tiny random Llama
directory with the byte tokenizer and the `role_colon` renderer, and a sixteen-chat corpus of
sums read by its own file builders (`tests/parity/chat_corpus.py`).

- `supervised.train.main` (`FromConversationFileBuilder`): two epochs of four steps, each
  logged; the second epoch's mean NLL below the first's; the final checkpoint recorded.
- `preference.train_dpo.main` (`DPODatasetBuilderFromComparisons` over
  `ComparisonBuilderFromJsonl`): its reference is the policy's own weights at step 0 (a
  sampling client of `save_weights_and_get_sampling_client`), so the first step's DPO loss is
  `log 2` to float rounding whatever the model — a check of the reference's
  `compute_logprobs` against the trainer's `forward`, over HTTP — and training lowers it, the
  right sums gaining on the wrong ones.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the cookbook's trainers need torch (.cbvenv)")

from tests.parity.porting import require_cookbook  # noqa: E402
from tests.parity.recipe_runs import (  # noqa: E402
    close_sdk_sessions,
    final_checkpoint,
    jsonl_rows,
    point_sdk_at,
)
from tests.parity.tiny_hf_model import write_tiny_llama  # noqa: E402
from tests.serve.server import Server, running_server  # noqa: E402

require_cookbook()
from tinker_cookbook.preference import train_dpo  # noqa: E402
from tinker_cookbook.preference.dpo_datasets import DPODatasetBuilderFromComparisons  # noqa: E402
from tinker_cookbook.preference.preference_datasets import ComparisonBuilderFromJsonl  # noqa: E402
from tinker_cookbook.supervised import train as supervised_train  # noqa: E402
from tinker_cookbook.supervised.data import FromConversationFileBuilder  # noqa: E402

from tests.parity.chat_corpus import (  # noqa: E402
    common_config,
    write_sum_chats,
    write_sum_comparisons,
)

pytestmark = pytest.mark.filterwarnings("ignore:DEPRECATED:FutureWarning")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(tmp_path_factory.mktemp("serve-sl") / "state") as served:
        yield served


@pytest.fixture(scope="module", autouse=True)
def _sessions_closed(server: Server) -> Iterator[None]:
    """After the module, before its server stops: the sessions the cookbook left open."""
    yield
    close_sdk_sessions()


@pytest.fixture
def pointed(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    point_sdk_at(server, monkeypatch)


@pytest.mark.usefixtures("pointed")
def test_the_cookbook_supervised_main_trains_over_serve(tiny_llama: str, tmp_path: Path) -> None:
    log_path = tmp_path / "sft"
    corpus = write_sum_chats(tmp_path / "sums.jsonl")
    config = supervised_train.Config(
        log_path=str(log_path),
        model_name=tiny_llama,
        recipe_name="sft-parity",
        renderer_name="role_colon",
        dataset_builder=FromConversationFileBuilder(
            file_path=str(corpus), common_config=common_config(tiny_llama, batch_size=4)
        ),
        learning_rate=5e-2,
        lr_schedule="constant",
        num_epochs=2,
        lora_rank=4,
        save_every=0,
        eval_every=0,
    )
    asyncio.run(supervised_train.main(config))
    rows = [row for row in jsonl_rows(log_path / "metrics.jsonl") if "train_mean_nll" in row]
    assert [row["step"] for row in rows] == list(range(8))
    nll = [row["train_mean_nll"] for row in rows]
    assert all(math.isfinite(value) for value in nll)
    assert sum(nll[4:]) < 0.9 * sum(nll[:4]), nll
    final_checkpoint(log_path)


@pytest.mark.usefixtures("pointed")
def test_the_cookbook_dpo_main_starts_at_log_2_and_trains_over_serve(
    tiny_llama: str, tmp_path: Path
) -> None:
    log_path = tmp_path / "dpo"
    comparisons = write_sum_comparisons(tmp_path / "comparisons.jsonl")
    config = train_dpo.Config(
        log_path=str(log_path),
        model_name=tiny_llama,
        recipe_name="dpo-parity",
        renderer_name="role_colon",
        dataset_builder=DPODatasetBuilderFromComparisons(
            comparison_builder=ComparisonBuilderFromJsonl(train_path=str(comparisons)),
            common_config=common_config(tiny_llama, batch_size=4),
        ),
        learning_rate=3e-3,
        lr_schedule="constant",
        num_epochs=2,
        dpo_beta=0.5,
        lora_rank=4,
        save_every=0,
        eval_every=0,
    )
    train_dpo.main(config)
    rows = [row for row in jsonl_rows(log_path / "metrics.jsonl") if "dpo_loss" in row]
    assert [row["step"] for row in rows] == list(range(8))
    losses = [row["dpo_loss"] for row in rows]
    assert losses[0] == pytest.approx(math.log(2), abs=1e-4)  # policy = reference at step 0
    assert sum(losses[4:]) < sum(losses[:4]) < 4 * math.log(2), losses
    final_checkpoint(log_path)
