"""The cookbook's multi-player and sandboxed recipes, ported, train offline through their own entry.

Each recipe's `train.py` runs as `python -m` would (`recipe_runs.run_ported_main`): the file
after the port rule alone (`tinker_cookbook` → `shell.cookbook` in its imports), executed as
`__main__` with `key=value` arguments, so its own `chz.entrypoint(CLIConfig)` builds its
`Config` and its own code calls the facade's `train.main(config)`. The recipes open
`tinker.ServiceClient()` themselves; what points them at the local backend is what a user sets
(`recipe_runs.offline_sdk_env`): `TINKER_BASE_URL` at an `rlpure serve` on a loopback port, a
`tml-` key, telemetry and the Hugging Face hub off. The player is a local checkpoint folder the
server and the client both read offline: the tiny random Llama with the byte tokenizer
(`tiny_hf_model.py`) and the renderer `role_colon`.

- `multiplayer_rl/twenty_questions`: the player trains on `rlpure serve`; the answerer is the
  dataset builder's own `tinker.ServiceClient(base_url=None)` (so `TINKER_BASE_URL`) sampling
  `rlpure/tiny`. The one override: the builder's `answerer_base_model` (the recipe's CLI has no
  such field; its default, Qwen3.5-9B, is neither on this server nor offline), set by wrapping
  the facade's `train.main` to `chz.replace` it in the `Config` the recipe built.
- `multiplayer_rl/text_arena`: tic-tac-toe from `textarena` (0.7.4), self-play in training and
  the recipe's default test opponent (`base_model`: the player's base model, sampled on the
  server) in the evaluation.
- `code_rl`: the recipe's own async `cli_main` (its CLI has `base_url`: the policy trains on
  `rlpure serve`), its grader's SandboxFusion client talking to `rlpure sandbox-serve`
  (`SANDBOX_URL`), which runs each test in a `LocalSandbox`; the DeepCoder data is a local
  folder with the hub dataset's name and columns, read by `datasets`' JSON loader. The policy
  is `tiny_chat_model`'s one-layer random Llama (a BPE with Qwen's chat and tool tokens), for
  a tool-calling renderer (`qwen3`). It never writes code, so the recipe's grader is also run
  on known answers (right, wrong, none, call-based, endless) in the same event loop.

Speed: see the README ("Recipes that train offline"), measured with `--durations`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import chz
import datasets
import httpx
import pytest

from shell.cookbook.rl import train
from tests.parity.porting import import_ported, require_cookbook, serve_ported_recipes
from tests.parity.recipe_runs import jsonl_rows, point_sdk_at, run_ported_main
from tests.parity.tiny_chat_model import write_tiny_chat_llama
from tests.parity.tiny_hf_model import write_tiny_llama
from tests.serve.server import RLPURE, running_server

require_cookbook()

ANSWERER = "rlpure/tiny"
"""A model `rlpure serve` knows by name; its recommended renderer is `role_colon`."""


@pytest.fixture(scope="module", autouse=True)
def _ported_recipes() -> Iterator[None]:
    with serve_ported_recipes():
        yield


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The player's arguments: the tiny byte-tokenizer Llama's folder and `role_colon`."""
    path = write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")
    return [f"model_name={path}", "renderer_name=role_colon"]


def _recipe(path: str) -> types.ModuleType:
    """The cookbook's `recipes/<path>` imported by the port rule."""
    return import_ported(f"recipes/{path}")


def _step_rows(log_path: Path) -> list[dict[str, Any]]:
    """The training steps' rows (not the final totals row)."""
    return [row for row in jsonl_rows(log_path / "metrics.jsonl") if "final_totals" not in row]


def test_twenty_questions_trains_with_the_answerer_on_rlpure_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, byte_model: list[str]
) -> None:
    """One step of 2 twenty-turn episodes: every player turn gets the answerer's reply, sampled
    by the recipe's own answerer client through `rlpure serve`."""
    real_main = train.main
    answerers: list[str] = []

    async def main_with_a_local_answerer(config: train.Config, *args: Any, **kwargs: Any) -> Any:
        builder: Any = chz.replace(config.dataset_builder, answerer_base_model=ANSWERER)
        answerers.append(builder.answerer_base_model)  # a TwentyQuestionsDatasetBuilder
        return await real_main(chz.replace(config, dataset_builder=builder), *args, **kwargs)

    log_path = tmp_path / "run"
    with running_server(tmp_path / "state", "-v") as server:
        point_sdk_at(server, monkeypatch)
        monkeypatch.setattr(train, "main", main_with_a_local_answerer)
        run_ported_main(
            "recipes/multiplayer_rl/twenty_questions/train.py",
            [
                *byte_model,
                "batch_size=1",
                "group_size=2",
                "max_tokens=8",
                "eval_every=0",
                "max_steps=1",
                f"log_path={log_path}",
            ],
            monkeypatch=monkeypatch,
        )
        log = server.log_text()

    assert answerers == [ANSWERER]  # the recipe's own __main__ called the facade's main once
    (row,) = _step_rows(log_path)
    assert row["step"] == 0
    assert row["env/all/total_episodes"] == 2 and row["env/all/total_turns"] == 40, row
    assert 0.0 <= row["env/all/reward/total"] <= 1.0, row
    # one sampling session, the answerer's on its base model (the player samples from the
    # weights it saves for sampling); the player and the answerer are each sampled once per
    # player turn (2 episodes x 20 turns)
    assert log.count('"POST /api/v1/create_sampling_session HTTP/1.1" 200') == 1, log[-3000:]
    assert log.count('"POST /api/v1/save_weights_for_sampler HTTP/1.1" 200') >= 1, log[-3000:]
    assert log.count('"POST /api/v1/asample HTTP/1.1" 200') >= 2 * 40, log[-3000:]
    (final,) = jsonl_rows(log_path / "checkpoints.jsonl")
    assert final["name"] == "final" and final["batch"] == 1
    assert final["state_path"].startswith("tinker://")


def test_text_arena_tictactoe_trains_by_self_play(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, byte_model: list[str]
) -> None:
    """Two steps of self-play tic-tac-toe and the evaluation against the recipe's default test
    opponent (the base model, sampled on the server)."""
    log_path = tmp_path / "run"
    with running_server(tmp_path / "state") as server:
        point_sdk_at(server, monkeypatch)
        module = run_ported_main(
            "recipes/multiplayer_rl/text_arena/train.py",
            [
                *byte_model,
                "batch_size=2",
                "num_train_datapoints=4",
                "num_test_datapoints=2",
                "max_tokens=8",
                "eval_every=1",
                "save_every=1",
                "max_steps=2",
                f"log_path={log_path}",
            ],
            monkeypatch=monkeypatch,
        )

    assert module.CLIConfig().test_opponent == "base_model"  # the default, not overridden
    *rows, final_eval = _step_rows(log_path)
    assert [row["step"] for row in rows] == [0, 1]
    for row in rows:
        assert row["env/all/total_episodes"] == 2, row  # one game, both sides
        # an illegal move costs its player -2 (ILLEGAL_MOVE_REWARD); a game's result is ±1 or 0
        assert -2.0 <= row["env/all/reward/total"] <= 1.0, row
        assert row["test/env/all/total_episodes"] == 2, row  # each side against the opponent
        assert -2.0 <= row["test/env/all/reward/total"] <= 1.0, row
    assert final_eval["final_eval"] == 1 and final_eval["step"] == 2, final_eval
    saved = jsonl_rows(log_path / "checkpoints.jsonl")
    # no periodic save on the last batch, the final one holds its weights (a documented
    # difference: the cookbook also writes 000002 there)
    assert [(c["name"], c["batch"]) for c in saved] == [("000001", 1), ("final", 2)]
    assert all(c["state_path"].startswith("tinker://") for c in saved), saved


# --- code_rl -------------------------------------------------------------------------------------

DEEPCODER = "agentica-org/DeepCoder-Preview-Dataset"
CODE_RENDERER = "qwen3"
"""A tool-calling renderer (the recipe's env declares its `check_solution` tool in the prompt);
`role_colon` has no tool-call format, here as in the cookbook."""
SUM_TESTS = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin_stdout", "metadata": {}}]
TOTAL_TESTS = [
    {
        "input": "[1, 2, 3]",
        "output": "6",
        "testtype": "functional",
        "metadata": {"func_name": "total"},
    }
]
DEEPCODER_ROWS: dict[str, dict[str, Any]] = {
    "primeintellect": {"problem": "Read two integers and print their sum.", "tests": SUM_TESTS},
    "taco": {
        "problem": "Read n and print n squared.",
        "tests": {"inputs": ["3\n"], "outputs": ["9\n"]},
    },
    "lcbv5": {
        "problem": "Return the sum of the list.",
        "tests": TOTAL_TESTS,
        "starter_code": "class Solution:\n    def total(self, nums: List[int]) -> int:\n        ",
    },
    "codeforces": {"problem": "Read two integers and print their sum.", "tests": SUM_TESTS},
}
"""One problem per DeepCoder subset, in its columns (`tests` and `metadata` are JSON strings):
stdin tests, TACO's `inputs`/`outputs` form, and a call-based test with starter code."""
DEEPCODER_SPLITS = {
    "primeintellect": ("train",),
    "taco": ("train",),
    "lcbv5": ("train", "test"),
    "codeforces": ("test",),
}
"""The subsets and splits the recipe loads (`code_env._load_deepcoder_split`)."""


def write_deepcoder_folder(root: Path) -> Path:
    """A local dataset folder named like the hub's DeepCoder, read by `datasets`' JSON loader.

    `load_dataset("agentica-org/DeepCoder-Preview-Dataset", name=..., split=...)` in a working
    directory holding `root / DEEPCODER` loads that folder: its README's `configs` name the
    subsets and their JSON-lines files, so the recipe's loader runs unchanged, offline.
    """
    folder = root / DEEPCODER
    lines = ["---", "configs:"]
    for name, splits in DEEPCODER_SPLITS.items():
        row = DEEPCODER_ROWS[name]
        record = {
            "problem": row["problem"],
            "tests": json.dumps(row["tests"]),
            "starter_code": row.get("starter_code", ""),
            "metadata": "{}",
        }
        lines += [f"- config_name: {name}", "  data_files:"]
        for split in splits:
            lines += [f"  - split: {split}", f"    path: {name}/{split}.jsonl"]
            (folder / name).mkdir(parents=True, exist_ok=True)
            (folder / name / f"{split}.jsonl").write_text(json.dumps(record) + "\n")
    (folder / "README.md").write_text("\n".join([*lines, "---", ""]))
    return folder


def _deepcoder_texts() -> list[str]:
    """What the policy's BPE learns its merges from: the recipe's prompts and a tool call."""
    lcb = _recipe("code_rl/lcb_utils.py")
    prompts = [
        lcb.fetch_live_code_bench_system_prompt(row["problem"], row.get("starter_code"))
        for row in DEEPCODER_ROWS.values()
    ]
    return [*prompts, '<tool_call>\n{"name": "check_solution", "arguments": {}}\n</tool_call>']


_SERVING = re.compile(r"SANDBOX_URL=(\S+)")


@contextlib.contextmanager
def running_sandbox_serve(log: Path) -> Iterator[str]:
    """`rlpure sandbox-serve --port 0` (its own process: `LocalSandbox` forks, which a process
    running JAX's threads should not); yields the `run_code` URL it prints once serving."""
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [RLPURE, "sandbox-serve", "--port", "0"], stdout=sink, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while not (printed := _SERVING.search(log.read_text(errors="replace"))):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        url = printed.group(1)
        while True:  # the socket is bound before the line is printed; uvicorn may still start
            with contextlib.suppress(httpx.TransportError):
                if httpx.post(url, json={"code": "pass"}, timeout=10).status_code == 200:
                    break
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)


SUM_SOLUTION = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"


async def _grade_with_the_recipes_grader() -> dict[str, Any]:
    """The recipe's own reward and test runner on known answers, through SandboxFusion's client."""
    tool = _recipe("code_rl/deepcoder_tool.py")
    grading = _recipe("code_rl/code_grading.py")
    task = tool.DeepcoderTask(problem=DEEPCODER_ROWS["primeintellect"]["problem"], tests=SUM_TESTS)
    reward = tool.DeepcoderReward(task=task)  # the SandboxFusion backend, as the recipe's default

    def said(text: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": task.problem}, {"role": "assistant", "content": text}]

    wrong = SUM_SOLUTION.replace("a + b", "a - b")
    functional = (
        "```python\nclass Solution:\n    def total(self, nums):\n        return sum(nums)\n```"
    )
    return {
        "right": await reward(said(SUM_SOLUTION)),
        "wrong": await reward(said(wrong)),
        "no code": await reward(said("I would add them.")),
        "functional": await grading.sandbox_check_correctness(
            TOTAL_TESTS, grading.extract_code_from_model(functional)
        ),
        "endless": await grading.sandbox_check_correctness(
            SUM_TESTS, "while True: pass", timeout=1
        ),
    }


def test_code_rl_trains_with_a_local_run_code_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`code_rl/train.py`'s own `cli_main` against `rlpure serve` (its `base_url`), its grader
    against `rlpure sandbox-serve`'s `run_code` (`SANDBOX_URL`), on DeepCoder-shaped data.

    DeepCoder itself is on the hub only, so the data is a local folder of the same name and
    columns (`write_deepcoder_folder`). The random policy writes no code, so the training step's
    reward is the format penalty; the grader's own classes are then checked on known answers in
    the same event loop (the recipe keeps one SandboxFusion client per process).
    """
    module = _recipe("code_rl/train.py")
    monkeypatch.chdir(tmp_path)  # the dataset's and the model's names are folders here
    write_deepcoder_folder(tmp_path)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")
    model = str(write_tiny_chat_llama(tmp_path / "tiny-chat-llama", _deepcoder_texts()))
    log_path = tmp_path / "run"
    with (
        running_sandbox_serve(tmp_path / "sandbox-serve.log") as sandbox_url,
        running_server(tmp_path / "state", "-v") as server,
    ):
        point_sdk_at(server, monkeypatch)
        monkeypatch.setenv("SANDBOX_URL", sandbox_url)
        cli = chz.entrypoint(
            module.CLIConfig,
            argv=[
                f"model_name={model}",
                f"renderer_name={CODE_RENDERER}",
                f"log_path={log_path}",
                f"base_url={server.url}",
                "lora_rank=4",
                "group_size=2",
                "groups_per_batch=1",
                "max_tokens=16",
                "eval_every=0",
                "max_steps=1",
            ],
        )

        async def train_then_grade() -> dict[str, Any]:
            await module.cli_main(cli)
            return await _grade_with_the_recipes_grader()

        graded = asyncio.run(train_then_grade())

    (row,) = _step_rows(log_path)
    assert row["step"] == 0 and row["env/all/total_episodes"] == 2, row
    # an answer cut at max_tokens ends the episode with the env's context_overflow_reward
    # (-0.1) and no grading, as in the cookbook; a graded one gets 0.1 * (has code - 1) + passed
    assert -0.1 - 1e-6 <= row["env/all/reward/total"] <= 1.0, row
    assert row.get("env/all/max_tokens_reached") == 1.0 or "env/all/format" in row, row
    (final,) = jsonl_rows(log_path / "checkpoints.jsonl")
    assert final["name"] == "final" and final["state_path"].startswith("tinker://")
    assert graded["right"] == (1.0, {"format": 1.0, "correct": 1.0}), graded
    assert graded["wrong"] == (0.0, {"format": 1.0, "correct": 0.0}), graded
    assert graded["no code"] == (pytest.approx(-0.1), {"format": 0.0, "correct": 0.0}), graded
    passed, details = graded["functional"]
    assert passed and details["run_result"]["status"] == "Finished", details
    passed, details = graded["endless"]
    # stopped by the recipe's test harness at its 1 s per-test timeout (not a crash): its
    # "Time Limit Exceeded" (error_code -3), after at least that second
    assert not passed and details["status"] == "Failed", details
    run = details["run_result"]
    assert "'error_code': -3" in run["stdout"] and "Time Limit Exceeded" in run["stdout"], run
    assert run["execution_time"] >= 1.0, details
