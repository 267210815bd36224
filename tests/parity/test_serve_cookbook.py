"""The cookbook's own RL loop (`tinker_cookbook.rl.train.main`) against `rlpure serve`, unpatched.

tinker-cookbook 0.6.1 and the tinker SDK 0.38 run as installed: no `tinker.ServiceClient` swap,
no `register_tokenizer`, no monkeypatching of the cookbook. What points them at the server is
what a user sets: the environment (`TINKER_BASE_URL`, `TINKER_API_KEY=tml-local`,
`TINKER_TELEMETRY=0`, `HF_HUB_OFFLINE=1`, `TRANSFORMERS_OFFLINE=1`) and the cookbook's config
fields (`base_url`, `model_name`, `log_path`, sizes).

The model name: the cookbook loads `get_tokenizer(model_name)` on the client side, and offline
only a local directory loads (`os.path.isdir` → `AutoTokenizer.from_pretrained`), so
`model_name` is the absolute path of a tiny random Llama checkpoint directory with the byte
tokenizer (`tests/parity/tiny_hf_model.py`). The server takes the same path as `base_model` (a
LoRA on a local pretrained model) and hands its tokenizer out through `get_info`.

- Arithmetic (`recipes/math_rl/arithmetic_env.py`): two steps with a checkpoint per step, the
  server stopped, a new one started on the same state dir and port, then a second `main` on
  the same `log_path` resumes from `checkpoints.jsonl` over HTTP
  (`create_training_client_from_state_with_optimizer`) and trains step 2.
- Twenty questions (`recipes/multiplayer_rl/twenty_questions/env.py`): its dataset builder
  makes its own `tinker.ServiceClient(base_url=...)` and an answerer sampling client. The
  answerer's renderer is not a field: the builder derives it from `answerer_base_model`'s name
  (`model_info.get_recommended_renderer_name`), which refuses a path ("Unknown model"). So
  the answerer is named `meta-llama/Llama-3.2-1B` (a base model, renderer `role_colon`), and
  that name is a relative directory in the working directory of the test and of the server
  it starts: both `get_tokenizer` (`os.path.isdir`) and the server (`resolve_base_model`:
  an existing path) read the tiny checkpoint there, nothing from the hub. The episode is 20
  turns (the env's own limit; the random policy never guesses).
- `fetch_model_pricing`, the one network call of `main`, in a fresh process: it returns `None`
  (offline: "Could not fetch"; online: the local model is not listed) within its own 5 s
  timeout plus start-up.

Speed (2 CPU cores, JAX's compilation cache warm, three server starts of ~3-5 s included):
arithmetic ~35-40 s, twenty questions ~35-55 s (~70 s with a cold cache: its prompts of up to
~1,800 tokens compile new shapes), pricing under 1 s.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.parity.porting import require_cookbook

require_cookbook()

import tinker  # noqa: E402
import tinker_cookbook.rl.train as cookbook_train  # noqa: E402
from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDatasetBuilder  # noqa: E402
from tinker_cookbook.recipes.multiplayer_rl.twenty_questions.env import (  # noqa: E402
    TwentyQuestionsDatasetBuilder,
)

from tests.parity.tiny_hf_model import write_tiny_llama  # noqa: E402
from tests.serve.server import Server, running_server, sdk_env  # noqa: E402

RENDERER = "role_colon"
LORA_RANK = 4
ANSWERER = "meta-llama/Llama-3.2-1B"
"""A base model the cookbook's `model_info` maps to `role_colon`; here a relative directory."""


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny checkpoint's absolute path: the policy's `model_name` in every test."""
    path = str(write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama"))
    assert ":" not in path  # the SDK cuts a tokenizer_id at its first ':'
    return path


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """The SDK's key and telemetry switch, and Hugging Face offline, for this process and the
    servers it starts; `TINKER_BASE_URL` is set per server (`_point_at`)."""
    monkeypatch.setenv("TINKER_API_KEY", "tml-local")
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    yield monkeypatch


def _point_at(monkeypatch: pytest.MonkeyPatch, server: Server) -> None:
    for name, value in sdk_env(server).items():
        monkeypatch.setenv(name, value)


def _config(
    dataset_builder: Any, log_path: Path, *, model: str, base_url: str, max_steps: int, **more: Any
) -> cookbook_train.Config:
    return cookbook_train.Config(
        learning_rate=1e-3,
        dataset_builder=dataset_builder,
        model_name=model,
        lora_rank=LORA_RANK,
        recipe_name="test_serve_cookbook",
        max_tokens=8,
        log_path=str(log_path),
        renderer_name=RENDERER,
        eval_every=0,
        max_steps=max_steps,
        base_url=base_url,
        **more,
    )


def _records(log_path: Path) -> list[dict[str, Any]]:
    lines = (log_path / "checkpoints.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _metric_rows(log_path: Path) -> list[dict[str, Any]]:
    """The rows of `metrics.jsonl` with training metrics (not the final token-totals row)."""
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if "progress/batch" in row]


def _run_id(tinker_path: str) -> str:
    """`tinker://{run_id}/weights/{name}` → the run id."""
    assert tinker_path.startswith("tinker://"), tinker_path
    return tinker_path.removeprefix("tinker://").split("/", 1)[0]


@pytest.mark.slow
# the cookbook 0.6.1's resume reads the checkpoint's renderer through
# `ServiceClient.create_rest_client()`, which the SDK 0.38 deprecates: theirs, not ours
@pytest.mark.filterwarnings("ignore:DEPRECATED. ServiceClient.create_rest_client:FutureWarning")
def test_arithmetic_trains_then_resumes_after_a_server_restart(
    tiny_model: str,
    offline: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Two steps on one server; a new server on the same state dir and port; a second `main`
    with one more step reads `checkpoints.jsonl`, resumes over HTTP and trains step 2."""
    log_path, state_dir = tmp_path / "run", tmp_path / "state"

    def run(server: Server, max_steps: int) -> None:
        builder = ArithmeticDatasetBuilder(
            batch_size=2,
            model_name_for_tokenizer=tiny_model,
            renderer_name=RENDERER,
            n_batches=4,
            group_size=2,
        )
        config = _config(
            builder,
            log_path,
            model=tiny_model,
            base_url=server.url,
            max_steps=max_steps,
            save_every=1,
        )
        asyncio.run(cookbook_train.main(config))

    with running_server(state_dir, "-v") as first:
        _point_at(offline, first)
        run(first, 2)
        first.stop()  # SIGTERM (its exit status is tests/serve/test_serve_safety.py's business)
        # read now: a server on the same port writes the same log file (`serve-{port}.log`)
        port, first_log = first.port, first.log_text()
    assert "Finished server process" in first_log, first_log[-3000:]
    assert [row["step"] for row in _metric_rows(log_path)] == [0, 1]
    saved = _records(log_path)
    assert [(r["name"], r["batch"]) for r in saved] == [("000001", 1), ("000002", 2), ("final", 2)]
    assert {_run_id(r["state_path"]) for r in saved} == {_run_id(r["sampler_path"]) for r in saved}
    first_run = _run_id(saved[-1]["state_path"])
    assert "/api/v1/load_weights" not in first_log

    with running_server(state_dir, "-v", port=port) as second:
        _point_at(offline, second)
        run(second, 3)
        rest = tinker.RestClient(base_url=second.url)
        listed = rest.list_training_runs().result().training_runs
        runs = {training_run.training_run_id: training_run for training_run in listed}
        first_checkpoints = rest.list_checkpoints(first_run).result().checkpoints
        second_log = second.log_text()

    # the cookbook's own log (`main` replaces the root handlers, so pytest's capture misses it)
    cookbook_log = (log_path / "logs.log").read_text()
    assert f"Resumed training from {saved[-1]['state_path']}" in cookbook_log
    rows = _metric_rows(log_path)
    assert [row["step"] for row in rows] == [0, 1, 2]
    assert rows[-1]["progress/batch"] == 2
    resumed = _records(log_path)[len(saved) :]
    assert [(r["name"], r["batch"]) for r in resumed] == [("000003", 3), ("final", 3)]
    new_run = _run_id(resumed[-1]["state_path"])
    assert new_run != first_run  # a new training run, as on Tinker
    assert resumed[-1]["cumulative_tokens"]["trained"] > saved[-1]["cumulative_tokens"]["trained"]
    # the restarted server knows both runs, the first one's checkpoints read back from disk
    assert {first_run, new_run} <= runs.keys(), runs
    for run_id in (first_run, new_run):
        assert runs[run_id].base_model == tiny_model
        assert runs[run_id].is_lora and runs[run_id].lora_rank == LORA_RANK
    assert {c.checkpoint_id for c in first_checkpoints} >= {"weights/final", "weights/000002"}
    # the new run was made from the saved state: the SDK looked up the checkpoint's run (its
    # base model and rank), then loaded the state with its optimizer
    lookup = (
        f'"GET /api/v1/training_runs/{quote(first_run, safe="")}?access_scope=owned HTTP/1.1" 200'
    )
    assert lookup in second_log, second_log[-3000:]
    assert '"POST /api/v1/load_weights HTTP/1.1" 200' in second_log, second_log[-3000:]


@pytest.mark.slow
def test_twenty_questions_builds_its_own_service_client_and_trains_a_step(
    offline: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The dataset builder's own `tinker.ServiceClient(base_url=...)` and answerer sampling
    client reach the server; one step of 2 × 20-turn episodes trains."""
    offline.chdir(tmp_path)  # the answerer's name is a directory here, for us and the server
    policy = str(write_tiny_llama(tmp_path / ANSWERER))
    log_path = tmp_path / "run"
    with running_server(tmp_path / "state", "-v") as server:
        _point_at(offline, server)
        builder = TwentyQuestionsDatasetBuilder(
            batch_size=1,
            model_name_for_tokenizer=policy,
            renderer_name=RENDERER,
            group_size=2,
            base_url=server.url,
            answerer_base_model=ANSWERER,
        )
        config = _config(builder, log_path, model=policy, base_url=server.url, max_steps=1)
        asyncio.run(cookbook_train.main(config))
        log = server.log_text()

    (row,) = _metric_rows(log_path)
    assert row["step"] == 0
    # every player turn got the answerer's reply (the env awaits it in `step`): 2 × 20 turns
    assert row["env/all/total_episodes"] == 2 and row["env/all/total_turns"] == 40, row
    final = _records(log_path)[-1]
    assert final["name"] == "final" and final["batch"] == 1
    assert final["state_path"].startswith("tinker://")
    # the answerer's sampler on its base model (the policy samples from the unnamed sampler
    # that `save_weights_for_sampler` makes); the answerer sampled 40 times through it
    assert '"POST /api/v1/create_sampling_session HTTP/1.1" 200' in log, log[-3000:]


PRICING_PROBE = """
import json, logging, sys, time
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from tinker_cookbook.utils.cost_estimation import fetch_model_pricing
started = time.monotonic()
rates = fetch_model_pricing(sys.argv[1])
print(json.dumps({"rates": None if rates is None else str(rates),
                  "seconds": time.monotonic() - started}))
"""


def test_the_pricing_fetch_fails_soft_and_fast_offline(tiny_model: str) -> None:
    """`rl.train.main` calls `fetch_model_pricing(model_name)` unpatched (the tests above); in
    a fresh process (its result is cached per process) it returns `None` with a warning, within
    its own 5 s timeout plus slack, whether the network is absent or present (a local model is
    not listed)."""
    done = subprocess.run(
        [sys.executable, "-c", PRICING_PROBE, tiny_model],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result = json.loads(done.stdout)
    assert result["rates"] is None, result
    assert result["seconds"] < 10.0, result
    assert "logging token counts only" in done.stderr, done.stderr
