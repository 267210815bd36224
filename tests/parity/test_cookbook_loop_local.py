"""The cookbook's own RL loop (`tinker_cookbook.rl.train.main`) on the local JAX backend.

Three cookbook 0.6.1 envs, unmodified, train through the cookbook's `rl.train.main` with one
swap, `tinker.ServiceClient` → `shell.local.LocalServiceClient`, and then a second `main` on the
same `log_path` resumes from the first one's last checkpoint and trains one more step:

- `recipes/math_rl/arithmetic_env.py` (`ArithmeticDatasetBuilder`, single turn, few-shot);
- `recipes/multiplayer_rl/guess_number/env.py` (`GuessNumberDatasetBuilder`, multi-turn);
- `rl/preference_envs.py` (`PairwisePreferenceRLDatasetBuilder`) with a scripted judge: a
  `PreferenceModel` subclass that prefers the longer completion, over a scripted in-memory
  `ComparisonDatasetBuilder`.

The hub is offline, so the model name `rlpure/tiny` gets the local byte tokenizer through the
cookbook's own extension point, `tokenizer_utils.register_tokenizer` (the loop and the envs
call `get_tokenizer(model_name)`, which consults that registry first). Nothing else of the
cookbook is patched except `fetch_model_pricing`, the one network call the loop makes: it
fails soft in the cookbook (returns `None` after a warning), but on a machine with a network
it would fetch a file, and tests stay offline.

The resume runs in the same process but through a new service, so it reads everything from
disk (`checkpoints.jsonl` and the checkpoint directories): with `checkpoint_dir` bound
(`functools.partial(LocalServiceClient, checkpoint_dir=...)`, what a user does to resume in
another process) and, for arithmetic, with the bare class and its temporary directory.

Speed (2 shared CPU cores): the bare-class case runs `rlpure/tiny` and the others a micro
model (`MICRO_CONFIG`); most of each case is compiling the model's stages. guess_number's
10-turn prompts reach ~2,000 tokens, and the local backend's CPU speed there is issue 14's
(on `rlpure/tiny` this case took ~10 minutes, on the micro model about a minute).
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.parity.porting import require_cookbook

require_cookbook()

import chz  # noqa: E402
import tinker  # noqa: E402
import tinker_cookbook.rl.train as cookbook_train  # noqa: E402
from tinker_cookbook import tokenizer_utils  # noqa: E402
from tinker_cookbook.preference.preference_datasets import ComparisonDatasetBuilder  # noqa: E402
from tinker_cookbook.preference.types import (  # noqa: E402
    Comparison,
    LabeledComparison,
    PreferenceModel,
)
from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDatasetBuilder  # noqa: E402
from tinker_cookbook.recipes.multiplayer_rl.guess_number.env import (  # noqa: E402
    GuessNumberDatasetBuilder,
)
from tinker_cookbook.rl.preference_envs import PairwisePreferenceRLDatasetBuilder  # noqa: E402

from rlpure import model as model_lib  # noqa: E402
from rlpure.model import VOCAB_SIZE, ByteTokenizer  # noqa: E402
from shell.local import LocalServiceClient  # noqa: E402

MODEL = "rlpure/tiny"
MICRO = "test/micro"
MICRO_CONFIG = model_lib.ModelConfig(
    vocab_size=VOCAB_SIZE, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=2048
)
"""A micro model with guess_number's context (its 10-turn prompts reach ~2,000 tokens): the
local backend's CPU speed on long prompts is issue 14's, and these tests check the plumbing."""
RENDERER = "role_colon"


def _micro_service(checkpoint_dir: Path) -> Callable[..., LocalServiceClient]:
    """What a user binds as `tinker.ServiceClient` to resume in another process: the local
    options (`checkpoint_dir`, an extra model config) fixed, the SDK's keywords passed on."""
    return functools.partial(
        LocalServiceClient, checkpoint_dir=checkpoint_dir, model_configs={MICRO: MICRO_CONFIG}
    )


@pytest.fixture
def cookbook_on_local(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[str]]]:
    """Registers the byte tokenizer as `MODEL`'s and records the local factories' calls."""
    for name in (MODEL, MICRO):
        tokenizer_utils.register_tokenizer(name, ByteTokenizer)
    # offline: the cookbook's pricing fetch fails soft (returns None), but would use the network
    monkeypatch.setattr(cookbook_train, "fetch_model_pricing", lambda model_name: None)
    calls: dict[str, list[str]] = {"lora": [], "resume": []}
    lora = LocalServiceClient.create_lora_training_client
    resume = LocalServiceClient.create_training_client_from_state_with_optimizer

    def record_lora(self: LocalServiceClient, base_model: str, *args: Any, **kwargs: Any) -> Any:
        calls["lora"].append(base_model)
        return lora(self, base_model, *args, **kwargs)

    def record_resume(self: LocalServiceClient, path: str, *args: Any, **kwargs: Any) -> Any:
        calls["resume"].append(path)
        return resume(self, path, *args, **kwargs)

    monkeypatch.setattr(LocalServiceClient, "create_lora_training_client", record_lora)
    monkeypatch.setattr(
        LocalServiceClient, "create_training_client_from_state_with_optimizer", record_resume
    )
    try:
        yield calls
    finally:
        for name in (MODEL, MICRO):
            tokenizer_utils.unregister_tokenizer(name)


# --- scripted preference data and judge -----------------------------------------------------


@chz.chz
class ScriptedComparisons(ComparisonDatasetBuilder):  # type: ignore[misc]
    """Six prompts (three batches of two), in memory (a `datasets.Dataset`, as the cookbook's builders return)."""

    def get_train_and_test_datasets(self) -> tuple[Any, None]:
        import datasets

        prompts = ["Say hi.", "Name a color.", "Count to 3.", "Say bye.", "Add 1 + 1.", "Spell a."]
        return datasets.Dataset.from_list([{"prompt": p} for p in prompts]), None

    def example_to_labeled_comparison(self, example: dict[str, Any]) -> LabeledComparison:
        prompt = [{"role": "user", "content": example["prompt"]}]
        return LabeledComparison(
            comparison=Comparison(prompt_conversation=prompt, completion_A=[], completion_B=[]),
            label="Tie",
        )


class LongerIsBetter(PreferenceModel):  # type: ignore[misc]
    """The scripted judge: prefers the longer completion (1.0: B, -1.0: A, 0.0: a tie)."""

    async def __call__(self, comparison: Comparison) -> float:
        def length(messages: list[Any]) -> int:
            return sum(len(str(m["content"])) for m in messages)

        a, b = length(comparison.completion_A), length(comparison.completion_B)
        return 0.0 if a == b else (1.0 if b > a else -1.0)


# --- the three cases --------------------------------------------------------------------------


def _arithmetic(model: str) -> Any:
    return ArithmeticDatasetBuilder(
        batch_size=2,
        model_name_for_tokenizer=model,
        renderer_name=RENDERER,
        n_batches=4,
        group_size=2,
    )


def _guess_number(model: str) -> Any:
    return GuessNumberDatasetBuilder(
        batch_size=1, renderer_name=RENDERER, train_group_size=2, model_name=model
    )


def _preference(model: str) -> Any:
    return PairwisePreferenceRLDatasetBuilder(
        comparison_builder=ScriptedComparisons(),
        batch_size=2,
        policy_renderer_name=RENDERER,
        policy_model_name=model,
        group_size=2,
        preference_model_builder=LongerIsBetter,
    )


def _config(
    dataset_builder: Any, log_path: Path, *, model: str, max_steps: int, **overrides: Any
) -> cookbook_train.Config:
    return cookbook_train.Config(
        learning_rate=1e-3,
        dataset_builder=dataset_builder,
        model_name=model,
        recipe_name="test_cookbook_loop_local",
        max_tokens=8,
        log_path=str(log_path),
        renderer_name=RENDERER,
        eval_every=0,
        max_steps=max_steps,
        **overrides,
    )


def _records(log_path: Path) -> list[dict[str, Any]]:
    lines = (log_path / "checkpoints.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _trained_steps(log_path: Path) -> list[int]:
    """The steps with training metrics in `metrics.jsonl` (not the final token-totals row)."""
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    return [row["step"] for row in rows if "progress/batch" in row]


def _first_run_then_resume(
    tmp_path: Path,
    calls: dict[str, list[str]],
    monkeypatch: pytest.MonkeyPatch,
    builder: Callable[[str], Any],
    *,
    service: Any,
    model: str = MICRO,
    **overrides: Any,
) -> None:
    """Two steps, then a second `main` on the same log path: resumes and trains step 2."""
    monkeypatch.setattr(tinker, "ServiceClient", service)
    log_path = tmp_path / "run"

    def run(max_steps: int) -> None:
        config = _config(builder(model), log_path, model=model, max_steps=max_steps, **overrides)
        asyncio.run(cookbook_train.main(config))

    run(2)
    assert calls == {"lora": [model], "resume": []}
    assert _trained_steps(log_path) == [0, 1]
    first = _records(log_path)
    assert first[-1]["name"] == "final" and first[-1]["batch"] == 2
    assert Path(first[-1]["state_path"]).is_dir()

    run(3)
    assert calls == {"lora": [model], "resume": [first[-1]["state_path"]]}
    assert _trained_steps(log_path) == [0, 1, 2]
    last = _records(log_path)[-1]
    assert last["name"] == "final" and last["batch"] == 3
    assert Path(last["state_path"]).is_dir() and Path(last["sampler_path"]).is_dir()
    assert last["state_path"] != first[-1]["state_path"]  # a new training run, as on Tinker


def test_arithmetic_trains_and_resumes_with_the_bare_local_service(
    tmp_path: Path, cookbook_on_local: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only `tinker.ServiceClient = LocalServiceClient` (its checkpoints in a temporary
    directory, alive until the process exits), with a periodic checkpoint every step."""
    _first_run_then_resume(
        tmp_path,
        cookbook_on_local,
        monkeypatch,
        _arithmetic,
        service=LocalServiceClient,
        model=MODEL,
        save_every=1,
    )


def test_arithmetic_rolling_checkpoints_are_deleted_through_the_rest_client(
    tmp_path: Path, cookbook_on_local: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rolling_save_every`: the cookbook deletes each superseded rolling state with
    `create_rest_client().delete_checkpoint_from_tinker_path`; only the final one stays."""
    states = tmp_path / "local_states"
    _first_run_then_resume(
        tmp_path,
        cookbook_on_local,
        monkeypatch,
        _arithmetic,
        service=_micro_service(states),
        save_every=0,
        rolling_save_every=1,
    )
    records = _records(tmp_path / "run")
    rolling = [r for r in records if r.get("rolling")]
    assert rolling, records
    assert not any(Path(r["state_path"]).exists() for r in rolling)
    finals = [r for r in records if r["name"] == "final"]
    assert len(finals) == 2 and all(Path(r["state_path"]).is_dir() for r in finals)


def test_guess_number_multi_turn_trains_and_resumes(
    tmp_path: Path, cookbook_on_local: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _first_run_then_resume(
        tmp_path,
        cookbook_on_local,
        monkeypatch,
        _guess_number,
        service=_micro_service(tmp_path / "local_states"),
    )


def test_preference_envs_with_a_scripted_judge_train_and_resume(
    tmp_path: Path, cookbook_on_local: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _first_run_then_resume(
        tmp_path,
        cookbook_on_local,
        monkeypatch,
        _preference,
        service=_micro_service(tmp_path / "local_states"),
    )


def test_the_cookbooks_renderer_check_reads_the_metadata_through_the_rest_client(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`checkpoint_utils.check_renderer_name_for_checkpoint_async`, which `main` runs on
    resume, on a local service: a match and a mismatch are logged, and a path that is no
    checkpoint is a warning (the cookbook catches `ValueError`), never a crash."""
    from tinker_cookbook import checkpoint_utils

    from tests.local.micro import MICRO_NAME, micro_service

    service = micro_service(tmp_path)
    trainer = service.create_lora_training_client(
        MICRO_NAME, user_metadata={"renderer_name": "role_colon"}
    ).result()
    path = trainer.save_state("final").result().path
    check = checkpoint_utils.check_renderer_name_for_checkpoint_async
    with caplog.at_level("INFO", logger="tinker_cookbook.checkpoint_utils"):
        asyncio.run(check(service, path, "role_colon"))
        assert "Renderer metadata matches" in caplog.text
        asyncio.run(check(service, path, "llama3"))
        assert "Renderer mismatch" in caplog.text
        asyncio.run(check(service, str(tmp_path / "missing"), "role_colon"))
        assert "Could not fetch renderer metadata" in caplog.text
