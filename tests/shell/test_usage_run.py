"""Token accounting on fake-SDK runs: the cookbook's `tokens/*` keys in every trained step's
metrics row, running totals in checkpoint rows, continued across a resume."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlpure.usage import TOKEN_KINDS, TokenUsage
from shell.config import TrainConfig, build_config
from shell.env import EnvGroupBuilder, RLDataset
from shell.errors import CheckpointError
from shell.fakes import (
    FakeCheckpointStore,
    FakeServiceClient,
    ScriptedDataset,
    ScriptedEnv,
    ScriptedGroupBuilder,
)
from shell.training import CHECKPOINTS_FILE, load_checkpoints, train
from shell.training._logs import read_jsonl

GROUPS, GROUP_SIZE, PROMPT = 3, 4, 3
STEP_KEYS = [f"tokens/{kind}" for kind in TOKEN_KINDS]
CUMULATIVE_KEYS = [f"tokens/cumulative/{kind}" for kind in TOKEN_KINDS]


def _dataset(num_batches: int, *, constant_reward: bool = False) -> ScriptedDataset:
    def builder(batch: int, problem: int) -> ScriptedGroupBuilder:
        target = 3 + (batch * 7 + problem) % 8

        def reward(action: np.ndarray) -> float:
            if constant_reward:
                return 1.0
            return float(np.mean(action == target)) if len(action) else 0.0

        return ScriptedGroupBuilder(
            lambda _: ScriptedEnv(prompt=[1, 2, target], reward_fn=reward, stop=()),
            group_size=GROUP_SIZE,
        )

    return ScriptedDataset(builder, num_batches=num_batches, groups_per_batch=GROUPS)


def _config(log_dir: Path, **options: Any) -> TrainConfig:
    return build_config(
        {"log_dir": str(log_dir), "backend": "fake", "progress": False, "max_tokens": 4},
        options,
    )


def _train(config: TrainConfig, service: FakeServiceClient, dataset: RLDataset) -> Any:
    return asyncio.run(train(config, dataset=dataset, service_client=service))


def _steps(log_dir: Path) -> list[dict[str, Any]]:
    return [row for row in read_jsonl(log_dir / "metrics.jsonl") if "final_eval" not in row]


def _checkpoint_rows(log_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (log_dir / CHECKPOINTS_FILE).read_text().splitlines()]


def test_every_step_logs_the_cookbooks_token_counts_and_their_running_totals(tmp_path):
    _train(_config(tmp_path, remove_constant_reward_groups=False), FakeServiceClient(), _dataset(3))
    rows = _steps(tmp_path)
    totals = dict.fromkeys(TOKEN_KINDS, 0)
    for row in rows:
        assert set(STEP_KEYS + CUMULATIVE_KEYS) <= set(row)
        trajectories = GROUPS * GROUP_SIZE
        assert row["tokens/prefill_uncached"] == PROMPT * trajectories  # fake: no cache hits
        assert row["tokens/prefill_cached"] == 0
        assert 0 < row["tokens/sampled"] <= 4 * trajectories
        # one datum per single-turn trajectory: prompt + action minus the last token
        assert row["tokens/trained"] == row["tokens/sampled"] + (PROMPT - 1) * trajectories
        for kind in TOKEN_KINDS:
            totals[kind] += row[f"tokens/{kind}"]
            assert row[f"tokens/cumulative/{kind}"] == totals[kind]
    (final,) = _checkpoint_rows(tmp_path)
    assert final["cumulative_tokens"] == totals
    assert final["discarded_tokens"] == dict.fromkeys(TOKEN_KINDS, 0)


def test_dropped_constant_reward_groups_count_only_in_the_running_and_discarded_totals(tmp_path):
    # every group constant: the first is trained on (as the cookbook), the other two discarded
    config = _config(tmp_path, remove_constant_reward_groups=True)
    _train(config, FakeServiceClient(), _dataset(2, constant_reward=True))
    rows = _steps(tmp_path)
    for row in rows:
        assert row["tokens/prefill_uncached"] == PROMPT * GROUP_SIZE  # the kept group's only
    (final,) = _checkpoint_rows(tmp_path)
    discarded = final["discarded_tokens"]
    assert discarded["prefill_uncached"] == 2 * 2 * PROMPT * GROUP_SIZE
    assert discarded["trained"] == 0 and discarded["sampled"] > 0
    for kind in TOKEN_KINDS:
        step_sum = sum(row[f"tokens/{kind}"] for row in rows)
        assert final["cumulative_tokens"][kind] == step_sum + discarded[kind]
        assert rows[-1][f"tokens/cumulative/{kind}"] == final["cumulative_tokens"][kind]


class _Kill(BaseException):
    """Simulates the process dying (not an `Exception`: nothing may catch it)."""


class _KilledAt(RLDataset):
    def __init__(self, inner: RLDataset, step: int) -> None:
        self.inner, self.step = inner, step

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if index == self.step:
            raise _Kill
        return self.inner.get_batch(index)

    def __len__(self) -> int:
        return len(self.inner)


def test_running_totals_continue_across_a_resume(tmp_path):
    reference_dir = tmp_path / "reference"
    _train(_config(reference_dir, save_every=2, seed=3), FakeServiceClient(), _dataset(4))

    log_dir = tmp_path / "killed"
    store = FakeCheckpointStore()
    config = _config(log_dir, save_every=2, seed=3)
    with pytest.raises(_Kill):
        _train(config, FakeServiceClient(store=store), _KilledAt(_dataset(4), 3))
    (saved,) = load_checkpoints(log_dir)
    assert saved.step == 2 and saved.cumulative_tokens.sampled > 0
    _train(config, FakeServiceClient(store=store), _dataset(4))

    def tokens(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in row.items() if k.startswith("tokens/")} for row in rows]

    assert tokens(_steps(log_dir)) == tokens(_steps(reference_dir))
    assert [r["cumulative_tokens"] for r in _checkpoint_rows(log_dir)][-1] == [
        r["cumulative_tokens"] for r in _checkpoint_rows(reference_dir)
    ][-1]


def test_checkpoint_rows_without_totals_or_written_by_the_cookbook_are_read(tmp_path):
    rows = [
        # an rlpure row from before token accounting: totals start from zero
        {"name": "000001", "batch": 1, "state_path": "fake://s/1", "step": 1,
         "rng_key_data": [0, 1], "final": False, "wall_time": 1.0, "kl_reference_path": None},
        # the cookbook's rl.train.main row (its _loop_state)
        {"name": "000002", "batch": 2, "state_path": "tinker://s/2", "sampler_path": None,
         "cumulative_tokens": {"sampled": 5, "prefill_cached": 1, "prefill_uncached": 7,
                               "trained": 11},
         "discarded_tokens": {"sampled": 2, "prefill_cached": 0, "prefill_uncached": 3,
                              "trained": 0}},
    ]  # fmt: skip
    (tmp_path / CHECKPOINTS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    older, cookbook = load_checkpoints(tmp_path)
    assert older.cumulative_tokens == TokenUsage() == older.discarded_tokens
    assert cookbook.cumulative_tokens == TokenUsage(
        sampled=5, prefill_cached=1, prefill_uncached=7, trained=11
    )
    assert cookbook.discarded_tokens == TokenUsage(sampled=2, prefill_uncached=3)


def test_a_row_with_a_damaged_token_total_is_refused_naming_the_field(tmp_path):
    row = {"name": "000002", "batch": 2, "state_path": "tinker://s/2",
           "cumulative_tokens": {"sampled": 5, "bogus": 1}}  # fmt: skip
    (tmp_path / CHECKPOINTS_FILE).write_text(json.dumps(row) + "\n")
    with pytest.raises(CheckpointError, match=r"'cumulative_tokens'.*unknown token kinds"):
        load_checkpoints(tmp_path)
