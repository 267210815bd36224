"""Token accounting on fake-SDK runs: the cookbook's `tokens/*` keys in every trained step's
metrics row, running totals in checkpoint rows and in the final totals row after the last step
(the cookbook's `CostTracker.cumulative_metrics()` row), continued across a resume."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlpure.cost import TokenCostRates
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
from shell.training._logs import is_step_row, read_jsonl

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
    """The step rows: all but the final evaluation's and the final totals row (see `_totals`)."""
    _totals(log_dir)
    return [row for row in read_jsonl(log_dir / "metrics.jsonl") if is_step_row(row)]


def _totals(log_dir: Path) -> dict[str, Any]:
    """The final totals row: exactly one, the last line of metrics.jsonl."""
    rows = read_jsonl(log_dir / "metrics.jsonl")
    assert [i for i, row in enumerate(rows) if "final_totals" in row] == [len(rows) - 1]
    return rows[-1]


def _expected_totals(step: int, cumulative: dict[str, int], discarded: dict[str, int]) -> Any:
    return {
        "step": step,
        "final_totals": 1,
        **{f"tokens/cumulative/{kind}": cumulative[kind] for kind in TOKEN_KINDS},
        **{f"tokens/discarded/{kind}": discarded[kind] for kind in TOKEN_KINDS},
    }


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
    assert _totals(tmp_path) == _expected_totals(3, totals, dict.fromkeys(TOKEN_KINDS, 0))


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
    assert _totals(tmp_path) == _expected_totals(2, final["cumulative_tokens"], discarded)


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
    assert _totals(log_dir) == _totals(reference_dir)
    assert [r["cumulative_tokens"] for r in _checkpoint_rows(log_dir)][-1] == [
        r["cumulative_tokens"] for r in _checkpoint_rows(reference_dir)
    ][-1]


def test_a_run_without_steps_still_logs_its_totals_row(tmp_path):
    # the cookbook's main logs cumulative_metrics() at end_batch even when no step ran
    _train(_config(tmp_path, max_steps=0), FakeServiceClient(), _dataset(2))
    zeros = dict.fromkeys(TOKEN_KINDS, 0)
    assert read_jsonl(tmp_path / "metrics.jsonl") == [_expected_totals(0, zeros, zeros)]


def test_a_price_table_prices_the_totals_row_as_the_cookbooks_cumulative_metrics(tmp_path):
    (tmp_path / "prices.toml").write_text(
        '[models."rlpure/tiny"]\nprefill = 1.0\ncached_prefill = 0.5\nsample = 2.0\ntrain = 4.0\n'
    )
    config = _config(
        tmp_path / "run",
        price_table=str(tmp_path / "prices.toml"),
        remove_constant_reward_groups=True,
    )
    _train(config, FakeServiceClient(), _dataset(1, constant_reward=True))
    (final,) = _checkpoint_rows(tmp_path / "run")
    rates = TokenCostRates(prefill=1.0, cached_prefill=0.5, sample=2.0, train=4.0)
    cumulative = TokenUsage(**final["cumulative_tokens"])
    discarded = TokenUsage(**final["discarded_tokens"])
    assert discarded.sampled > 0  # two of the three groups were dropped
    assert _totals(tmp_path / "run") == {
        **_expected_totals(1, final["cumulative_tokens"], final["discarded_tokens"]),
        "cost/cumulative_usd": rates.estimate_usd(cumulative),
        "cost/discarded_usd": rates.estimate_usd(discarded),
    }  # and no cost/step_usd: the row holds levels only


@pytest.mark.parametrize(
    "mode",
    [
        {"stream_minibatch_config": {"groups_per_batch": GROUPS, "num_minibatches": GROUPS}},
        {"async_config": {"max_steps_off_policy": 1, "groups_per_batch": GROUPS}},
    ],
    ids=["stream", "async"],
)
def test_the_streaming_and_async_modes_end_with_the_same_totals_row(tmp_path, mode):
    _train(_config(tmp_path, **mode), FakeServiceClient(), _dataset(2))
    assert [row["step"] for row in _steps(tmp_path)] == [0, 1]
    final = _checkpoint_rows(tmp_path)[-1]
    assert final["name"] == "final"
    assert _totals(tmp_path) == _expected_totals(
        2, final["cumulative_tokens"], final["discarded_tokens"]
    )
    assert final["cumulative_tokens"]["sampled"] > 0


def test_a_resume_past_the_end_drops_the_old_totals_row_and_writes_one_at_its_end(tmp_path):
    def run(max_steps: int) -> Any:
        config = _config(tmp_path / "run", max_steps=max_steps, eval_every=10, seed=5)
        return asyncio.run(
            train(
                config,
                dataset=_dataset(3),
                service_client=FakeServiceClient(store=store),
                test_dataset=_dataset(1),
            )
        )

    store = FakeCheckpointStore()
    run(2)
    first = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [(r["step"], "final_eval" in r, "final_totals" in r) for r in first] == [
        (0, False, False), (1, False, False), (2, True, False), (2, False, True),
    ]  # fmt: skip
    assert run(3).start_step == 2
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert rows[:2] == first[:2]
    assert [(r["step"], "final_eval" in r, "final_totals" in r) for r in rows] == [
        (0, False, False), (1, False, False), (2, False, False), (3, True, False),
        (3, False, True),
    ]  # fmt: skip
    final = _checkpoint_rows(tmp_path / "run")[-1]
    assert final["batch"] == 3
    assert _totals(tmp_path / "run") == _expected_totals(
        3, final["cumulative_tokens"], final["discarded_tokens"]
    )
    for kind in TOKEN_KINDS:
        assert rows[-1][f"tokens/cumulative/{kind}"] == rows[2][f"tokens/cumulative/{kind}"]
        assert rows[-1][f"tokens/cumulative/{kind}"] >= first[-1][f"tokens/cumulative/{kind}"]
    assert rows[-1]["tokens/cumulative/sampled"] > first[-1]["tokens/cumulative/sampled"]


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
