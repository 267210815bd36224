"""Group rollouts on real executors: a spawn-started process pool and Dask `distributed`.

The pickling contract (`shell.rollouts.set_rollout_executor`): each group travels to the
executor as one pickled task — its `EnvGroupBuilder`, the policy (a `TinkerTokenCompleter`
holding the sampling client), the strategy and the termination policy — and runs there as
`asyncio.run(...)` on a fresh event loop; the `TrajectoryGroup` comes back pickled. So
builders must be importable, module-level classes whose state pickles (no lambdas, open
files, locks or objects bound to the parent's event loop), envs are made in the worker by
`make_envs`, and `cleanup()` runs there once per group (the parent's copy of the builder
never sees the worker's changes: these tests count cleanups in a file). The fake SDK's
sampling client pickles, as Tinker's does.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from rlpure.records import Metrics
from shell.config import AsyncConfig, TrainConfig
from shell.env import Env, EnvGroupBuilder
from shell.fakes import FakeServiceClient, ScriptedDataset, ScriptedEnv
from shell.rollouts import get_rollout_executor, set_rollout_executor
from shell.training import TrainResult, train


class FileLoggedGroup(EnvGroupBuilder):
    """A picklable group of two scripted envs (rewards 0 and 1) that appends
    `"<tag> <pid>"` to `log_path` at cleanup, in whichever process runs it."""

    def __init__(self, tag: str, log_path: str) -> None:
        self.tag = tag
        self.log_path = log_path

    async def make_envs(self) -> Sequence[Env]:
        return [ScriptedEnv(prompt=[1, 2, 3], rewards=(float(i),), stop=()) for i in range(2)]

    async def compute_group_rewards(
        self, trajectory_group: Sequence[Any], env_group: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        return [(0.0, {}) for _ in trajectory_group]

    async def cleanup(self) -> None:
        with open(self.log_path, "a", encoding="utf-8") as out:
            out.write(f"{self.tag} {os.getpid()}\n")

    def logging_tags(self) -> list[str]:
        return ["executor"]


class _Make:
    """Picklable `make_builder(batch, problem)` for `ScriptedDataset`."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = str(log_path)

    def __call__(self, batch: int, problem: int) -> FileLoggedGroup:
        return FileLoggedGroup(f"{batch}-{problem}", self.log_path)


def _run_with(executor: Executor, config: TrainConfig, log_path: Path) -> TrainResult:
    dataset = ScriptedDataset(_Make(log_path), num_batches=2, groups_per_batch=2)

    async def main() -> TrainResult:
        set_rollout_executor(executor)
        try:
            return await train(config, dataset=dataset, service_client=FakeServiceClient())
        finally:
            set_rollout_executor(None)

    return asyncio.run(main())


def _config(tmp_path: Path, **fields: Any) -> TrainConfig:
    return TrainConfig(
        backend="fake", log_dir=str(tmp_path / "run"), max_tokens=4, progress=False, **fields
    )


def _cleanups(log_path: Path) -> list[tuple[str, int]]:
    lines = log_path.read_text(encoding="utf-8").splitlines()
    return [(tag, int(pid)) for tag, pid in (line.split() for line in lines)]


@pytest.mark.slow  # a spawned worker imports jax and the shell (~5 s on 2 cores)
def test_a_spawn_process_pool_runs_each_group_once_in_its_worker(tmp_path: Path) -> None:
    log_path = tmp_path / "cleanups.txt"
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    with pool:
        result = _run_with(pool, _config(tmp_path), log_path)
    assert result.end_step == 2 and result.skipped_steps == ()
    cleanups = _cleanups(log_path)
    assert sorted(tag for tag, _ in cleanups) == ["0-0", "0-1", "1-0", "1-1"]  # once each
    assert {pid for _, pid in cleanups} != {os.getpid()}  # in the worker, not here
    assert get_rollout_executor() is None


def test_a_fork_process_pool_is_refused_with_the_fix() -> None:
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"))
    with pool, pytest.raises(ValueError, match=r"get_context\('spawn'\)"):
        set_rollout_executor(pool)
    assert get_rollout_executor() is None


@pytest.fixture(scope="module")
def dask_executor() -> Any:
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client.get_executor()


@pytest.mark.parametrize(
    "mode",
    [
        {},
        {"async_config": AsyncConfig(max_steps_off_policy=1, groups_per_batch=2)},
    ],
    ids=["sync", "async"],  # streaming starts its groups as async does
)
def test_dask_distributed_runs_every_mode_each_group_once(
    tmp_path: Path, dask_executor: Any, mode: dict[str, Any]
) -> None:
    log_path = tmp_path / "cleanups.txt"
    result = _run_with(dask_executor, _config(tmp_path, **mode), log_path)
    assert result.end_step == 2
    assert sorted(tag for tag, _ in _cleanups(log_path)) == ["0-0", "0-1", "1-0", "1-1"]
