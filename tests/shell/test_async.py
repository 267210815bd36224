"""Async off-policy training (`TrainConfig.async_config`, `shell.training._async`).

The cookbook's `do_async_training` on the fake SDK: rollouts keep going while training runs,
at most `groups_per_batch * (max_steps_off_policy + 1)` groups in flight, oldest sampler
first, staleness metrics, a clean shutdown, and a resume that trains no group twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from shell.cli import summary_line
from shell.config import AsyncConfig, StreamMinibatchConfig, TrainConfig
from shell.errors import CheckpointError, ConfigError, EnvFailure
from shell.fakes import (
    FakeCheckpointStore,
    FakeServiceClient,
    ScriptedDataset,
    ScriptedEnv,
    ScriptedGroupBuilder,
)
from shell.training import train
from shell.training._async import ASYNC_STATE_FILE, check_async_dataset, group_seed
from shell.training._policy_update import records_stability_info


def _async(max_steps_off_policy: int = 1, groups_per_batch: int = 2, **kw: Any) -> AsyncConfig:
    return AsyncConfig(
        max_steps_off_policy=max_steps_off_policy, groups_per_batch=groups_per_batch, **kw
    )


def test_async_runs_train_with_the_async_loss_and_record_stability_info() -> None:
    config = TrainConfig(backend="fake", async_config=_async())
    assert config.training_loss_fn() == "stable_reinforce"  # the cookbook's default
    assert records_stability_info(config)
    ppo = TrainConfig(backend="fake", async_config=_async(loss_fn="ppo"))
    assert ppo.training_loss_fn() == "ppo" and not records_stability_info(ppo)
    assert TrainConfig(backend="fake").training_loss_fn() == "importance_sampling"


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"async_config": _async(max_steps_off_policy=-1)}, "max_steps_off_policy: must be >= 0"),
        ({"async_config": _async(groups_per_batch=0)}, "groups_per_batch: must be >= 1"),
        (
            {"async_config": _async(), "loss_fn": "ppo"},
            "loss_fn: 'ppo' conflicts with async_config.loss_fn 'stable_reinforce'",
        ),
        (
            {"async_config": _async(), "backend": "local"},
            "async_config.loss_fn: 'stable_reinforce' is a Tinker loss the local backend",
        ),
        (
            {
                "async_config": _async(),
                "stream_minibatch_config": StreamMinibatchConfig(
                    groups_per_batch=2, num_minibatches=1
                ),
            },
            "not supported",
        ),
        (
            {
                "async_config": _async(),
                "kl_penalty_coef": 0.1,
                "kl_discount": 0.5,
                "kl_reference_model": "m",
            },
            "kl_discount: 0.5 > 0 is not supported with loss_fn 'stable_reinforce'",
        ),
    ],
)
def test_bad_async_options_are_config_errors(fields: dict[str, object], match: str) -> None:
    fields = {"backend": "fake", **fields}
    with pytest.raises(ConfigError, match=match):
        TrainConfig(**fields)  # type: ignore[arg-type]


def test_the_cookbooks_default_loss_may_stay_beside_an_async_loss() -> None:
    config = TrainConfig(
        backend="local", loss_fn="importance_sampling", async_config=_async(loss_fn="ppo")
    )
    assert config.training_loss_fn() == "ppo"


# --- runs on the fake SDK ------------------------------------------------------------------------


class Stop(BaseException):
    """A scripted kill: not an `Exception`, so no strategy catches it."""


class _Group(ScriptedGroupBuilder):
    """Group `(batch, problem)`: prompt `[1, 100 + batch, 200 + problem]`, rewards `index % 2`
    (all 1 when `constant`), env latency `latency` seconds and `turns` event-loop turns; logs
    `("start", where)` / `("done", where)` in `log`."""

    def __init__(
        self,
        batch: int,
        problem: int,
        *,
        log: list[tuple[Any, ...]],
        latency: float = 0.0,
        turns: int = 0,
        error: BaseException | None = None,
        constant: bool = False,
    ) -> None:
        self.where = (batch, problem)
        self.log = log

        def make(index: int) -> ScriptedEnv:
            return ScriptedEnv(
                prompt=[1, 100 + batch, 200 + problem],
                rewards=(1.0 if constant else float(index % 2),),
                latency=latency,
                turns=turns,
                stop=(),
                fail_at_step=None if error is None else 0,
                error=error,
            )

        super().__init__(make, group_size=2, tags=("async",))

    async def make_envs(self) -> Any:
        self.log.append(("start", self.where))
        return await super().make_envs()

    async def cleanup(self) -> None:
        await super().cleanup()
        self.log.append(("done", self.where))


def _config(tmp_path: Path, **fields: Any) -> TrainConfig:
    return TrainConfig(
        backend="fake", log_dir=str(tmp_path / "run"), max_tokens=4, progress=False, **fields
    )


def _trained(service: FakeServiceClient) -> list[list[tuple[int, int]]]:
    """Per forward_backward call, the groups its datums came from (one call per step)."""
    out = []
    for client in service.training_clients:
        for chunk in client.sent_data:
            where = {
                (d.model_input.to_ints()[1] - 100, d.model_input.to_ints()[2] - 200) for d in chunk
            }
            out.append(sorted(where))
    return out


def test_an_async_run_trains_every_group_once_with_staleness_metrics(tmp_path: Path) -> None:
    # problem p's rollouts take 3p event-loop turns, so groups finish out of order, and in the
    # same order whatever the machine's load (wall-clock latencies made the schedule, and so
    # the staleness, depend on it)
    log: list[tuple[Any, ...]] = []
    dataset = ScriptedDataset(
        lambda b, p: _Group(b, p, log=log, turns=3 * p), num_batches=4, groups_per_batch=3
    )
    service = FakeServiceClient()
    config = _config(tmp_path, async_config=_async(max_steps_off_policy=1, groups_per_batch=3))
    result = asyncio.run(train(config, dataset=dataset, service_client=service))
    assert (result.start_step, result.end_step) == (0, 4)
    trained = _trained(service)
    assert len(trained) == 4 and all(len(step) == 3 for step in trained)
    flat = [g for step in trained for g in step]
    assert sorted(flat) == [(b, p) for b in range(4) for p in range(3)]  # each once
    # each step trains the groups of the oldest sampler first; the slow (2, 2), sampled after
    # step 0, trains at step 3, two steps stale: no group is discarded for staleness (the
    # cookbook's rule), so staleness may exceed max_steps_off_policy
    assert trained == [
        [(0, 0), (0, 1), (1, 0)],
        [(0, 2), (1, 1), (1, 2)],
        [(2, 0), (2, 1), (3, 0)],
        [(2, 2), (3, 1), (3, 2)],
    ]
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [row for row in rows if "training_client/step" in row]
    assert [row["training_client/step"] for row in steps] == [0, 1, 2, 3]
    for row in steps:
        for key in (
            "async/staleness_max",
            "async/staleness_min",
            "async/staleness_mean",
            "sampling_client/step_mean",
            "time/sampling_time_max",
            "optim/lr",
            "progress/done_frac",
            "env/all/reward/total",
        ):
            assert key in row, key
        step = row["training_client/step"]
        assert row["async/staleness_max"] == step - row["sampling_client/step_min"]
        assert row["async/staleness_min"] == step - row["sampling_client/step_max"]
    staleness = [(row["async/staleness_min"], row["async/staleness_max"]) for row in steps]
    assert staleness == [(0, 0), (1, 1), (0, 1), (1, 2)]
    records = (tmp_path / "run" / "checkpoints.jsonl").read_text().splitlines()
    assert [json.loads(r)["name"] for r in records] == ["000000", "final"]  # as the cookbook
    # stable_reinforce (the default) sent with provenance on every datum
    fb = [e for e in service.events if e[0] == "forward_backward"]
    assert {e[2] for e in fb} == {"stable_reinforce"}
    assert all(
        d.loss_fn_input_spans is not None for c in service.training_clients[0].sent_data for d in c
    )


def test_a_run_whose_groups_are_filtered_out_reports_the_steps_it_ran(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # batch 0's two groups train step 0; every later group has one reward and is dropped, so
    # the data runs out at step 1 of 4: the result and the summary say so, not "4 steps"
    log: list[tuple[Any, ...]] = []
    dataset = ScriptedDataset(
        lambda b, p: _Group(b, p, log=log, constant=b > 0), num_batches=4, groups_per_batch=2
    )
    service = FakeServiceClient()
    config = _config(
        tmp_path,
        async_config=_async(max_steps_off_policy=1, groups_per_batch=2),
        remove_constant_reward_groups=True,
    )
    with caplog.at_level(logging.WARNING):
        result = asyncio.run(train(config, dataset=dataset, service_client=service))
    assert (result.start_step, result.ran_out_at, result.end_step) == (0, 1, 4)
    assert _trained(service) == [[(0, 0), (0, 1)]]
    assert "ran out of data after 1 of 4 steps" in caplog.text
    line = summary_line(result)
    assert line.startswith(
        "Trained steps 0..0 (1 of the 4 planned: the data ran out, groups were filtered out or "
        f"failed) in {tmp_path / 'run'}"
    ), line

    every = ScriptedDataset(
        lambda b, p: _Group(b, p, log=log, constant=True), num_batches=2, groups_per_batch=2
    )
    config = _config(
        tmp_path / "none",
        async_config=_async(max_steps_off_policy=1, groups_per_batch=2),
        remove_constant_reward_groups=True,
    )
    result = asyncio.run(train(config, dataset=every, service_client=FakeServiceClient()))
    assert (result.ran_out_at, result.end_step) == (0, 2)
    assert summary_line(result).startswith(
        f"Trained no step in {tmp_path / 'none' / 'run'}: the data ran out at step 0 of 2"
    )


def test_at_most_groups_per_batch_times_lag_plus_one_groups_are_in_flight(tmp_path: Path) -> None:
    log: list[tuple[Any, ...]] = []
    dataset = ScriptedDataset(lambda b, p: _Group(b, p, log=log), num_batches=6, groups_per_batch=2)
    service = FakeServiceClient()
    service.events = log
    for lag in (0, 2):
        log.clear()
        service.training_clients.clear()
        config = _config(
            tmp_path / str(lag),
            async_config=_async(max_steps_off_policy=lag, groups_per_batch=2, loss_fn="ppo"),
        )
        asyncio.run(train(config, dataset=dataset, service_client=service))
        started, trained, most = 0, 0, 0
        for event in log:
            if event[0] == "start":
                started += 1
                most = max(most, started - trained)
            elif event[0] == "optim_step":
                trained += 2
        assert most <= 2 * (lag + 1)
        assert most == 2 * (lag + 1)  # sampling does run ahead when training lags
        assert started == 12


def test_a_slow_group_is_trained_late_not_discarded(tmp_path: Path) -> None:
    log: list[tuple[Any, ...]] = []
    # group (0, 0) takes 0.3 s while the others finish at once: it is trained last, stale
    dataset = ScriptedDataset(
        lambda b, p: _Group(b, p, log=log, latency=0.3 if (b, p) == (0, 0) else 0.0),
        num_batches=4,
        groups_per_batch=2,
    )
    service = FakeServiceClient()
    config = _config(tmp_path, async_config=_async(max_steps_off_policy=1, groups_per_batch=2))
    asyncio.run(train(config, dataset=dataset, service_client=service))
    trained = _trained(service)
    assert sorted(g for step in trained for g in step) == [
        (b, p) for b in range(4) for p in range(2)
    ]
    late = next(i for i, step in enumerate(trained) if (0, 0) in step)
    assert late >= 2  # more than max_steps_off_policy steps after its sampler
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert rows[late]["async/staleness_max"] == late  # sampled at step 0
    # oldest sampler first: within each step, no group waited behind a newer one
    assert all(row["async/staleness_min"] >= 0 for row in rows if "async/staleness_min" in row)


def test_an_error_stops_every_loop_and_each_started_group_cleans_up_once(tmp_path: Path) -> None:
    log: list[tuple[Any, ...]] = []
    builders: list[_Group] = []

    def make(b: int, p: int) -> _Group:
        error = EnvFailure("boom") if (b, p) == (1, 1) else None
        builders.append(_Group(b, p, log=log, latency=0.01, error=error))
        return builders[-1]

    dataset = ScriptedDataset(make, num_batches=4, groups_per_batch=2)
    config = _config(tmp_path, async_config=_async(max_steps_off_policy=1, groups_per_batch=2))

    async def main() -> set[asyncio.Task[Any]]:
        with pytest.raises(EnvFailure, match="boom"):
            await train(config, dataset=dataset, service_client=FakeServiceClient())
        return asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]

    assert asyncio.run(main()) == set()  # no leaked task
    for builder in builders:
        assert builder.cleanup_calls == builder.make_envs_calls <= 1


def test_a_killed_async_run_resumes_without_training_a_group_twice(tmp_path: Path) -> None:
    log: list[tuple[Any, ...]] = []
    kill = {"first": True, "second": False}

    def make(b: int, p: int) -> _Group:
        killed = (kill["first"] and (b, p) == (4, 0)) or kill["second"]
        return _Group(b, p, log=log, latency=0.003 * p, error=Stop() if killed else None)

    dataset = ScriptedDataset(make, num_batches=6, groups_per_batch=2)
    store = FakeCheckpointStore()
    config = _config(
        tmp_path, save_every=2, async_config=_async(max_steps_off_policy=2, groups_per_batch=2)
    )
    first = FakeServiceClient(store=store)
    with pytest.raises(Stop):
        asyncio.run(train(config, dataset=dataset, service_client=first))
    records = (tmp_path / "run" / "checkpoints.jsonl").read_text().splitlines()
    resumed_at = json.loads(records[-1])["batch"]
    assert resumed_at >= 2
    before = _trained(first)[:resumed_at]  # what the checkpoint's weights hold

    def last_row() -> dict[str, Any]:  # what a resume at `resumed_at` reads
        rows = (tmp_path / "run" / ASYNC_STATE_FILE).read_text().splitlines()
        return [r for r in map(json.loads, rows) if r["step"] == resumed_at][-1]

    pending = last_row()["pending"]
    assert pending  # groups in flight at the checkpoint, lost and owed
    # killed again at once (every rollout raises) before a step trains: nothing is lost
    kill.update(first=False, second=True)
    with pytest.raises(Stop):
        asyncio.run(train(config, dataset=dataset, service_client=FakeServiceClient(store=store)))
    assert last_row()["pending"] == pending

    kill["second"] = False
    third = FakeServiceClient(store=store)
    result = asyncio.run(train(config, dataset=dataset, service_client=third))
    assert (result.start_step, result.end_step) == (resumed_at, 6)
    everything = sorted(g for step in before + _trained(third) for g in step)
    assert everything == [(b, p) for b in range(6) for p in range(2)]  # each exactly once


def test_a_damaged_async_state_stops_a_resume_before_the_log_dir_changes(
    tmp_path: Path,
) -> None:
    # a bad row that is not the last one used to be read only once the run had rewritten
    # config.json, cut its logs back and opened its clients
    dataset = ScriptedDataset(lambda b, p: _Group(b, p, log=[]), num_batches=4, groups_per_batch=2)
    store = FakeCheckpointStore()
    config = _config(
        tmp_path, save_every=1, async_config=_async(max_steps_off_policy=1, groups_per_batch=2)
    )
    asyncio.run(train(config, dataset=dataset, service_client=FakeServiceClient(store=store)))
    run = tmp_path / "run"
    with (run / "checkpoints.jsonl").open("r+") as rows:  # resume before the final row
        kept = rows.read().splitlines()[:-1]
        rows.seek(0)
        rows.write("\n".join(kept) + "\n")
        rows.truncate()
    state = run / ASYNC_STATE_FILE
    lines = state.read_text().splitlines()
    state.write_text("\n".join(['{"step": 1, "cursor": "nowhere"}', *lines[1:]]) + "\n")
    before = {path.name: path.read_bytes() for path in run.iterdir() if path.is_file()}
    service = FakeServiceClient(store=store)
    with pytest.raises(CheckpointError, match=f"{ASYNC_STATE_FILE}: row 1: "):
        asyncio.run(train(config, dataset=dataset, service_client=service))
    after = {path.name: path.read_bytes() for path in run.iterdir() if path.is_file()}
    assert after == before and service.events == []


def test_group_seeds_do_not_depend_on_the_schedule() -> None:
    seeds = {group_seed(3, (b, j)) for b in range(20) for j in range(8)}
    assert len(seeds) == 160 and all(0 <= s < 2**31 for s in seeds)


def test_groups_per_batch_larger_than_the_batches_is_refused(tmp_path: Path) -> None:
    dataset = ScriptedDataset(lambda b, p: _Group(b, p, log=[]), num_batches=2, groups_per_batch=2)
    config = _config(tmp_path, async_config=_async(groups_per_batch=3))
    with pytest.raises(
        ConfigError, match="groups_per_batch: 3 is larger than the dataset's batches"
    ):
        check_async_dataset(config, dataset)
    check_async_dataset(_config(tmp_path, async_config=_async(groups_per_batch=1)), dataset)


def test_train_refuses_a_bad_async_batch_size_before_anything_runs(tmp_path: Path) -> None:
    dataset = ScriptedDataset(lambda b, p: _Group(b, p, log=[]), num_batches=2, groups_per_batch=2)
    service = FakeServiceClient()
    config = _config(tmp_path, async_config=_async(groups_per_batch=3))
    with pytest.raises(ConfigError, match="groups_per_batch: 3 is larger"):
        asyncio.run(train(config, dataset=dataset, service_client=service))
    assert service.events == [] and not (tmp_path / "run" / "config.json").exists()


@pytest.mark.slow  # compiles the micro model's stages (a few seconds)
def test_an_async_run_trains_and_resumes_on_the_local_backend(tmp_path: Path) -> None:
    from tests.local.micro import MICRO_NAME, micro_service

    dataset = ScriptedDataset(lambda b, p: _Group(b, p, log=[]), num_batches=3, groups_per_batch=2)

    def run(name: str, max_steps: int, **mode: Any) -> Any:
        config = TrainConfig(
            backend="local",
            base_model=MICRO_NAME,
            log_dir=str(tmp_path / name),
            max_tokens=4,
            max_steps=max_steps,
            progress=False,
            **mode,
        )
        service = micro_service(tmp_path / name / "local_states")
        return asyncio.run(train(config, dataset=dataset, service_client=service))

    async_config = _async(max_steps_off_policy=1, groups_per_batch=2, loss_fn="ppo")
    first = run("async", 2, async_config=async_config)
    assert (first.start_step, first.end_step) == (0, 2)
    resumed = run("async", 3, async_config=async_config)
    assert (resumed.start_step, resumed.end_step) == (2, 3)
    rows = [json.loads(x) for x in (tmp_path / "async" / "metrics.jsonl").read_text().splitlines()]
    assert [r["training_client/step"] for r in rows if "training_client/step" in r] == [0, 1, 2]
