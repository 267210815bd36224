"""Cookbook 0.6.1 recipes train offline through their own entry points, ported, on `rlpure serve`.

Each case runs a recipe's `train.py` as `python -m` would (`tests/parity/recipe_runs.py`): the
file after the port rule alone, executed as `__main__` with `key=value` arguments, so its own
`chz.entrypoint(CLIConfig)` builds its `Config` and its own code calls the facade's `main`
(`shell.cookbook.rl.train.main`). The recipes open `tinker.ServiceClient()` themselves; what
points them at the local backend is what a user sets: `TINKER_BASE_URL` at an `rlpure serve` on
a free loopback port (one server for the module), a `tml-` key, telemetry and the Hugging Face
hub off. The arguments change only the model, sizes (groups, group size, tokens, steps: two, one
for guess_number's ten-turn games) and paths (`log_path`). The model is a local checkpoint
directory the server and the client both read offline: the tiny random Llama with the byte
tokenizer (`tiny_hf_model.py`) and the renderer `role_colon`, or for rl_numerics_check, whose
env calls a tool that `role_colon` cannot render (the cookbook's raises too), the same Llama
with a BPE carrying Qwen's chat and tool tokens (`tiny_chat_model.py`) and `qwen3`. Where a
recipe's default cannot run on the local backend, one more argument says so:

- `loss_fn=importance_sampling` for math_rl, whose default `stable_reinforce` runs on Tinker
  only (the server refuses it at `forward_backward`, naming the known losses);
- `eval_every=0` for math_rl on GSM8K and for guess_number, whose evaluations (at step 0 and at
  the end) would play the whole test split (1,319 problems; 103 numbers x 4 players x 10 turns).

Data, with no patch of `datasets`: math_rl's GSM8K builder calls
`datasets.load_dataset("openai/gsm8k", name="main", split=...)`; run from a working directory
holding a folder `openai/gsm8k` (the files of `../shared/data/gsm8k`, the hub's rows, and a
README whose `configs` name them: `recipe_runs.write_local_dataset`), `datasets` reads that
folder, as a user without the hub would arrange it. rl_numerics_check reads WikiText-103
(`Salesforce/wikitext`, `wikitext-103-raw-v1`), which has no local copy here: **a data
substitution** — its folder holds the GSM8K questions as the `text` column (natural English
prose, not WikiText), so the recipe's own page cutting, word counting and grading run on real
prose; its numbers are not WikiText's. guess_number and preference/shorter need no data;
shorter's judge is the recipe's own `PreferenceModelShorter`, which the recipe wires in itself: a
real judge of the comparison protocol (1.0 when completion B is preferred, -1.0 for A, 0.0 a
tie) that prefers the shorter reply; the test checks each group's tournament against the
sampled replies' lengths, and the judge itself on replies of known lengths.

Each case asserts what the run left: a `metrics.jsonl` row for each step with the loop's and
the env's keys and rewards in the env's range, the final token totals, a final checkpoint in
`checkpoints.jsonl` that the server lists, `samples.jsonl`, and the recipe's own name in
`recipe_options.json` (so its `Config` is what ran).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.parity.porting import import_ported, require_cookbook, serve_ported_recipes
from tests.parity.recipe_runs import (
    jsonl_rows,
    point_sdk_at,
    run_ported_main,
    write_local_dataset,
)

require_cookbook()

import datasets  # noqa: E402
import tinker  # noqa: E402

from tests.parity.tiny_chat_model import write_tiny_chat_llama  # noqa: E402
from tests.parity.tiny_hf_model import write_tiny_llama  # noqa: E402
from tests.serve.server import Server, running_server  # noqa: E402

GSM8K_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"
LORA_RANK = 4
STEPS = 2


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The model arguments of the recipes that use `role_colon`: the tiny byte-tokenizer Llama."""
    path = write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")
    return [f"model_name={path}", "renderer_name=role_colon"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One `rlpure serve` for the module (its compiled stages serve every recipe)."""
    with running_server(tmp_path_factory.mktemp("serve") / "state") as running:
        yield running


@pytest.fixture
def on_server(server: Server, monkeypatch: pytest.MonkeyPatch) -> Server:
    """The SDK's environment pointed at `server`, the hub offline."""
    point_sdk_at(server, monkeypatch)
    return server


@pytest.fixture
def gsm8k_json() -> dict[str, str]:
    """The local GSM8K files by split; skips where `../shared/data/gsm8k` is absent."""
    files = {split: GSM8K_DIR / f"{split}.jsonl" for split in ("train", "test")}
    if not all(path.is_file() for path in files.values()):
        pytest.skip(f"needs the GSM8K files in {GSM8K_DIR}")
    return {split: str(path) for split, path in files.items()}


@pytest.fixture
def hub_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working directory for local dataset folders named like the hub's (`tmp_path`), with
    `datasets`' cache inside it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")
    return tmp_path


# --- what every run leaves --------------------------------------------------------------------


def _steps(log_path: Path, steps: int) -> list[dict[str, Any]]:
    """The rows of `metrics.jsonl` with training metrics, after checking the final totals."""
    rows = jsonl_rows(log_path / "metrics.jsonl")
    totals = [row for row in rows if row.get("final_totals")]
    assert len(totals) == 1 and totals[0]["step"] == steps, rows[-1]
    assert totals[0]["tokens/cumulative/trained"] > 0
    return [row for row in rows if "progress/batch" in row]


def _check_run(
    log_path: Path,
    server: Server,
    *,
    recipe_name: str,
    reward: tuple[float, float],
    env_keys: tuple[str, ...],
    steps: int = STEPS,
) -> list[dict[str, Any]]:
    """Asserts what a run of `steps` steps leaves in `log_path` and on `server`; returns the
    training rows of `metrics.jsonl`."""
    rows = _steps(log_path, steps)
    assert [row["step"] for row in rows] == list(range(steps))
    low, high = reward
    for row in rows:
        missing = {"env/all/reward/total", "optim/lr", "tokens/trained", *env_keys} - row.keys()
        assert missing == set(), f"step {row['step']}: {sorted(missing)}"
        assert low <= row["env/all/reward/total"] <= high, (row["step"], reward)
        assert row["tokens/trained"] > 0 and row["batch/num_datums"] > 0
    options = json.loads((log_path / "recipe_options.json").read_text())
    assert options["recipe"] == recipe_name, options
    assert jsonl_rows(log_path / "samples.jsonl"), "no sampled trajectories recorded"
    final = jsonl_rows(log_path / "checkpoints.jsonl")[-1]
    assert (final["name"], final["batch"]) == ("final", steps), final
    run_id = final["state_path"].removeprefix("tinker://").split("/", 1)[0]
    listed = tinker.RestClient(base_url=server.url).list_checkpoints(run_id).result()
    paths = {checkpoint.tinker_path for checkpoint in listed.checkpoints}
    assert {final["state_path"], final["sampler_path"]} <= paths, paths
    return rows


def _prompts(log_path: Path) -> list[str]:
    """The first observation of every trajectory in `samples.jsonl`, as text."""
    return [row["turns"][0]["ob"] for row in jsonl_rows(log_path / "samples.jsonl")]


# --- the recipes ------------------------------------------------------------------------------


def _math_rl_args(model: list[str], log_path: Path, env: str) -> list[str]:
    return [
        f"env={env}",
        *model,
        f"lora_rank={LORA_RANK}",
        "groups_per_batch=2",
        "group_size=2",
        f"max_steps={STEPS}",
        f"log_path={log_path}",
        "loss_fn=importance_sampling",  # the default stable_reinforce is Tinker's only
    ]


MATH_KEYS = ("env/all/format", "env/all/correct")
MATH_REWARD = (-0.1, 1.0)  # ProblemEnv: correct + 0.1 * (format - 1)


def test_math_rl_arithmetic_trains(
    on_server: Server, byte_model: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_path = tmp_path / "run"
    run_ported_main(
        "recipes/math_rl/train.py",
        _math_rl_args(byte_model, log_path, "arithmetic"),
        monkeypatch=monkeypatch,
    )
    _check_run(
        log_path, on_server, recipe_name="recipe_math_rl", reward=MATH_REWARD, env_keys=MATH_KEYS
    )
    for prompt in _prompts(log_path):
        assert re.search(r"User: What is \d+ \+ \d+\?", prompt), prompt


def test_math_rl_gsm8k_trains_on_the_local_files(
    on_server: Server,
    byte_model: list[str],
    gsm8k_json: dict[str, str],
    hub_folders: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    splits = {split: Path(path) for split, path in gsm8k_json.items()}
    write_local_dataset(hub_folders, "openai/gsm8k", {"main": splits})
    log_path = tmp_path / "run"
    run_ported_main(
        "recipes/math_rl/train.py",
        [*_math_rl_args(byte_model, log_path, "gsm8k"), "eval_every=0"],
        monkeypatch=monkeypatch,
    )
    _check_run(
        log_path, on_server, recipe_name="recipe_math_rl", reward=MATH_REWARD, env_keys=MATH_KEYS
    )
    questions = [row["question"] for row in jsonl_rows(Path(gsm8k_json["train"]))]
    for prompt in _prompts(log_path):
        assert any(question in prompt for question in questions), prompt


def test_rl_numerics_check_trains_on_local_prose(
    on_server: Server,
    gsm8k_json: dict[str, str],
    hub_folders: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its env calls a `read_page` tool, which `role_colon` cannot render: the model is the
    tiny Llama with a BPE carrying Qwen's chat and tool tokens, and the renderer `qwen3`."""
    questions = [row["question"] for row in jsonl_rows(Path(gsm8k_json["train"]))]
    tool_call = '<tool_call>\n{"name": "read_page", "arguments": {"page": 1}}\n</tool_call>'
    model = write_tiny_chat_llama(tmp_path / "tiny-chat-llama", [*questions[:2000], tool_call])

    # a data substitution (module docstring): GSM8K's questions as WikiText's `text` column
    prose = [{"text": question} for question in questions]
    write_local_dataset(
        hub_folders, "Salesforce/wikitext", {"wikitext-103-raw-v1": {"train": prose}}
    )
    log_path = tmp_path / "run"
    run_ported_main(
        "recipes/rl_numerics_check/train.py",
        [
            f"model_name={model}",
            "renderer_name=qwen3",
            f"lora_rank={LORA_RANK}",
            "groups_per_batch=2",
            "group_size=2",
            "max_tokens=8",
            "max_trajectory_tokens=1536",
            "task.num_pages_min=1",
            "task.num_pages_max=2",
            "task.page_chars=200",
            f"max_steps={STEPS}",
            f"log_path={log_path}",
        ],
        monkeypatch=monkeypatch,
    )
    _check_run(
        log_path,
        on_server,
        recipe_name="recipe_rl_numerics_check",
        reward=(-0.1, 1.0),  # closeness in [0, 1]; a failed parse or an overflow -0.1
        # one tag on every group: no per-tag `env/rl_numerics_check/...` keys, as the cookbook
        env_keys=("env/all/turns_per_episode", "env/all/stop/max_tokens"),
    )
    for prompt in _prompts(log_path):
        assert "read_page" in prompt and "<|im_start|>" in prompt, prompt
    # the word to count is drawn from the corpus: it is a word of the local prose
    prose_words = set(re.findall(r"[a-z]+", " ".join(questions).lower()))
    for prompt in _prompts(log_path):
        (word,) = re.findall(r'count how many times the word "([^"]+)"', prompt)
        assert word.lower() in prose_words, word


def test_guess_number_trains(
    on_server: Server, byte_model: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_path = tmp_path / "run"
    run_ported_main(
        "recipes/multiplayer_rl/guess_number/train.py",
        [
            *byte_model,
            "batch_size=1",
            "group_size=2",
            "max_tokens=8",
            "max_steps=1",  # ten turns a game: one step
            "eval_every=0",
            f"log_path={log_path}",
        ],
        monkeypatch=monkeypatch,
    )
    steps = _check_run(
        log_path,
        on_server,
        recipe_name="recipe_multiplayer_guess_number",
        reward=(-10.0, 1.0),  # per turn: -1 unparsed, 0 wrong, 1 right (which ends the game)
        env_keys=("env/all/turns_per_episode",),
        steps=1,
    )
    assert all(1 <= row["env/all/turns_per_episode"] <= 10 for row in steps)


def _content(action: str) -> str:
    """A sampled `role_colon` reply (as `samples.jsonl` spells it) as its `parse_response` reads
    it: a trailing EOS dropped, the text before the stop sequence `"\\n\\nUser:"` without the
    rendered leading space, and without a stop sequence also without the trailing blank line."""
    content, stop, _ = action.removesuffix("<|eos|>").partition("\n\nUser:")
    content = content.removeprefix(" ")
    return content if stop else content.removesuffix("\n\n")


def test_preference_shorter_trains_with_its_length_judge(
    on_server: Server, byte_model: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_path = tmp_path / "run"
    run_ported_main(
        "recipes/preference/shorter/train.py",
        [
            *byte_model,
            "batch_size=2",
            "group_size=2",
            "max_tokens=32",  # longer replies: their decoded lengths differ more often
            f"max_steps={STEPS}",
            f"log_path={log_path}",
        ],
        monkeypatch=monkeypatch,
    )
    _check_run(
        log_path,
        on_server,
        recipe_name="recipe_preference_shorter",
        reward=(-2.0, 1.0),  # mean win-minus-loss + (format - 1)
        env_keys=("env/all/win_minus_loss", "env/all/format"),
    )
    # the recipe's judge (`PreferenceModelShorter`) in each group of two, played both ways:
    # the shorter reply wins (+1, the other -1), equal lengths tie
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for row in jsonl_rows(log_path / "samples.jsonl"):
        groups.setdefault((row["step"], row["group"]), []).append(row)
    summaries = {
        (row["iteration"], row["group_idx"], row["traj_idx"]): row["trajectory_metrics"]
        for step in range(STEPS)
        for row in jsonl_rows(log_path / f"iteration_{step:06d}" / "train_rollout_summaries.jsonl")
    }
    for (step, group), (first, second) in sorted(groups.items()):
        lengths = [len(_content(row["turns"][0]["ac"])) for row in (first, second)]
        wins = [summaries[step, group, row["traj"]]["win_minus_loss"] for row in (first, second)]
        expected = (lengths[1] > lengths[0]) - (lengths[1] < lengths[0])
        assert wins == [expected, -expected], (lengths, wins)
        for row, win in zip((first, second), wins, strict=True):
            valid = summaries[step, group, row["traj"]]["format"]
            assert row["total_reward"] == pytest.approx(win + valid - 1.0)
    # sampled replies may all tie (a random model often stops only at max_tokens): the judge
    # the recipe wired in also decides replies of known, different lengths
    assert _judged("a longer reply", "short") == 1.0  # B (shorter) preferred
    assert _judged("short", "a longer reply") == -1.0
    assert _judged("same", "size") == 0.0


def _judged(reply_a: str, reply_b: str) -> float:
    """The recipe's `PreferenceModelShorter` on one prompt and the replies `reply_a`, `reply_b`."""
    with serve_ported_recipes():
        env = import_ported("recipes/preference/shorter/env.py")
    comparison = env.Comparison(
        prompt_conversation=env.CONVO_PREFIX,
        completion_A=[{"role": "assistant", "content": reply_a}],
        completion_B=[{"role": "assistant", "content": reply_b}],
    )
    return float(asyncio.run(env.PreferenceModelShorter()(comparison)))
