"""The port rule on cookbook 0.6.1's own envs: prefix rewrite only, then `shell.cookbook.rl.train.main`.

Each test imports a cookbook env file through `tests.parity.porting.ported_module` (its
`tinker_cookbook` imports rewritten to `shell.cookbook`, nothing else changed), builds the cookbook's
dataset builder, trains two steps through `shell.cookbook.rl.train.main` on the local backend, then
resumes for a third. The envs: `recipes/math_rl/arithmetic_env.py` (single turn, `ProblemEnv`),
`recipes/multiplayer_rl/guess_number/env.py` (multi-turn) and `rl/preference_envs.py` (group
rewards from a preference model; here a scripted judge). Also: `shell.cookbook.rl.train.Config` has the
cookbook `Config`'s fields, required fields and defaults. Skipped without the cookbook.

The model is the tiny local model's architecture shrunk to compile in seconds, with its
2048-token context (guess_number's ten-turn conversations pass 1024 bytes); renderer
`role_colon`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import chz
import pytest

from rlpure.model import VOCAB_SIZE, ModelConfig
from shell.cookbook.preference.types import Comparison, PreferenceModel
from shell.cookbook.renderers import get_text_content
from shell.cookbook.rl import train
from shell.local import LocalServiceClient
from tests.parity.porting import ported_module, require_cookbook

MODEL = "test/port-micro"
MODEL_CONFIG = ModelConfig(
    vocab_size=VOCAB_SIZE, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=2048
)


@pytest.fixture(autouse=True)
def _cookbook() -> None:
    require_cookbook()


def _service(log_path: Path) -> LocalServiceClient:
    return LocalServiceClient(
        seed=0, checkpoint_dir=log_path / "local_states", model_configs={MODEL: MODEL_CONFIG}
    )


def _steps(log_path: Path) -> list[int]:
    """The steps of the step rows; the final totals row (after the last step, at its end
    step) must be the last row, and the only one."""
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    assert [i for i, row in enumerate(rows) if "final_totals" in row] == [len(rows) - 1]
    return [row["step"] for row in rows[:-1] if "final_eval" not in row]


def _train_then_resume(log_path: Path, builder: Any, recipe: str) -> list[dict[str, Any]]:
    """Two steps through `main`, then a resume to step 3; returns the metrics rows but the
    final totals row (the resume drops the first call's and writes its own, see `_steps`)."""

    def config(max_steps: int) -> train.Config:
        return train.Config(
            learning_rate=1e-3,
            dataset_builder=builder,
            model_name=MODEL,
            recipe_name=recipe,
            max_tokens=4,
            log_path=str(log_path),
            renderer_name="role_colon",
            eval_every=0,
            max_steps=max_steps,
        )

    first = asyncio.run(train.main(config(2), service_client=_service(log_path)))
    assert (first.start_step, first.end_step) == (0, 2)
    assert _steps(log_path) == [0, 1]
    resumed = asyncio.run(train.main(config(3), service_client=_service(log_path)))
    assert (resumed.start_step, resumed.end_step) == (2, 3)
    assert _steps(log_path) == [0, 1, 2]
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 3
    return rows[:-1]


def test_arithmetic_env_ports_and_trains(tmp_path: Path) -> None:
    module = ported_module("recipes/math_rl/arithmetic_env.py")
    builder = module.ArithmeticDatasetBuilder(
        batch_size=2,
        model_name_for_tokenizer=MODEL,
        renderer_name="role_colon",
        n_batches=4,
        group_size=2,
    )
    rows = _train_then_resume(tmp_path / "run", builder, "port_arithmetic")
    assert all("env/all/correct" in row and "env/all/format" in row for row in rows)


def test_guess_number_env_ports_and_trains(tmp_path: Path) -> None:
    module = ported_module("recipes/multiplayer_rl/guess_number/env.py")
    builder = module.GuessNumberDatasetBuilder(
        batch_size=2, renderer_name="role_colon", train_group_size=2, model_name=MODEL
    )
    rows = _train_then_resume(tmp_path / "run", builder, "port_guess_number")
    # an untrained model never guesses right: every episode runs the ten turns
    assert all(row["env/all/turns_per_episode"] == 10 for row in rows)


class LongerReplyJudge(PreferenceModel):
    """A scripted preference model: prefers the longer completion (1.0 for B, -1.0 for A)."""

    async def __call__(self, comparison: Comparison) -> float:
        a = sum(len(get_text_content(m)) for m in comparison.completion_A)
        b = sum(len(get_text_content(m)) for m in comparison.completion_B)
        return float((b > a) - (b < a))


def test_preference_envs_port_and_train_with_a_scripted_judge(tmp_path: Path) -> None:
    module = ported_module("rl/preference_envs.py")
    from shell.cookbook.preference.preference_datasets import ComparisonBuilderFromJsonl

    rows_path = tmp_path / "comparisons.jsonl"
    prompts = ["Say hi", "Name a color", "Count to three", "Pick a number"]
    rows_path.write_text(
        "".join(
            json.dumps(
                {
                    "comparison": {
                        "prompt_conversation": [{"role": "user", "content": prompt}],
                        "completion_A": [{"role": "assistant", "content": "a"}],
                        "completion_B": [{"role": "assistant", "content": "bb"}],
                    },
                    "label": "B",
                }
            )
            + "\n"
            for prompt in prompts
        )
    )
    builder = module.PairwisePreferenceRLDatasetBuilder(
        comparison_builder=ComparisonBuilderFromJsonl(train_path=str(rows_path)),
        batch_size=1,
        policy_renderer_name="role_colon",
        policy_model_name=MODEL,
        group_size=2,
        preference_model_builder=LongerReplyJudge,
    )
    rows = _train_then_resume(tmp_path / "run", builder, "port_preference")
    assert all("env/all/win_minus_loss" in row for row in rows)


_CONFIG_EXTENSIONS = {
    "mismatch_correction": None,
    "kl_penalty_estimator": "k1",
    "overlong": None,
    "dynamic_sampling": None,
}
"""rlpure's extensions of `Config` (issue 30), after the cookbook's fields, with their off value."""


def test_config_has_the_cookbook_fields_required_fields_and_defaults() -> None:
    from tinker_cookbook.rl import train as cookbook_train

    for ours, theirs in [
        (train.Config, cookbook_train.Config),
        (train.KLReferenceConfig, cookbook_train.KLReferenceConfig),
        (train.AsyncConfig, cookbook_train.AsyncConfig),
        (train.StreamMinibatchConfig, cookbook_train.StreamMinibatchConfig),
    ]:
        mine, cookbook = chz.chz_fields(ours), chz.chz_fields(theirs)
        extensions = _CONFIG_EXTENSIONS if ours is train.Config else {}
        assert list(mine) == list(cookbook) + list(extensions), ours.__name__
        for name, off in extensions.items():  # rlpure's own fields come last, default off
            assert mine[name]._default == off, name
        for name in cookbook:
            assert repr(mine[name]._default) == repr(cookbook[name]._default), name
            factory, cookbook_factory = mine[name]._default_factory, cookbook[name]._default_factory
            assert callable(factory) == callable(cookbook_factory), name
            if callable(cookbook_factory) and callable(factory):
                assert factory() == cookbook_factory(), name
