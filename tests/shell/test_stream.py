"""Streaming minibatches (`TrainConfig.stream_minibatch_config`, `shell.training._stream`).

The cookbook's `do_sync_training_with_stream_minibatch` on the fake SDK: each minibatch of a
step's groups goes to `forward_backward` as soon as its groups arrive, one `optim_step` per
substep; bad options are `ConfigError`s before anything runs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from shell.config import StreamMinibatchConfig, TrainConfig, build_config
from shell.errors import ConfigError, EnvFailure
from shell.fakes import FakeServiceClient, ScriptedDataset, ScriptedEnv, ScriptedGroupBuilder
from shell.training import train
from shell.training._stream import check_stream_dataset


@pytest.mark.parametrize(
    ("groups_per_batch", "num_minibatches", "num_substeps", "match"),
    [
        (0, 1, 1, "must be >= 1"),
        (4, 0, 1, "must be >= 1"),
        (4, 1, 3, "not divisible by num_substeps 3"),
        (4, 3, 1, "3 minibatches do not divide the 4 groups of a substep"),
        (8, 3, 2, "3 minibatches do not divide the 4 groups of a substep"),
    ],
)
def test_minibatches_that_do_not_divide_the_batch_are_refused(
    groups_per_batch: int, num_minibatches: int, num_substeps: int, match: str
) -> None:
    stream = StreamMinibatchConfig(
        groups_per_batch=groups_per_batch, num_minibatches=num_minibatches
    )
    with pytest.raises(ConfigError, match=match):
        TrainConfig(backend="fake", num_substeps=num_substeps, stream_minibatch_config=stream)


def test_the_stream_config_reads_from_a_config_file_table() -> None:
    config = build_config(
        {
            "backend": "fake",
            "stream_minibatch_config": {"groups_per_batch": 4, "num_minibatches": 2},
        }
    )
    assert config.stream_minibatch_config == StreamMinibatchConfig(
        groups_per_batch=4, num_minibatches=2
    )
    with pytest.raises(ConfigError, match="stream_minibatch_config"):
        build_config({"stream_minibatch_config": {"groups_per_batch": 4}})


# --- runs on the fake SDK ------------------------------------------------------------------------


class _Group(ScriptedGroupBuilder):
    """A group whose envs take `latency` seconds per step, reward `index % 2` (mixed groups),
    and log `("done", batch, problem)` in `log` at cleanup."""

    def __init__(
        self,
        batch: int,
        problem: int,
        *,
        log: list[tuple[Any, ...]],
        latency: float = 0.0,
        constant: bool = False,
        failing: bool = False,
    ) -> None:
        self.where = (batch, problem)
        self.log = log

        def make(index: int) -> ScriptedEnv:
            reward = 1.0 if constant else float(index % 2)
            return ScriptedEnv(
                prompt=[1, 2, 3 + problem],
                rewards=(reward,),
                latency=latency,
                stop=(),
                fail_at_step=0 if failing else None,
            )

        super().__init__(make, group_size=2, tags=("stream",))

    async def cleanup(self) -> None:
        await super().cleanup()
        self.log.append(("done", *self.where))


def _config(tmp_path: Path, **fields: Any) -> TrainConfig:
    return TrainConfig(
        backend="fake",
        log_dir=str(tmp_path / "run"),
        max_tokens=4,
        progress=False,
        num_groups_to_log=0,
        **fields,
    )


def _stream(groups_per_batch: int, num_minibatches: int) -> StreamMinibatchConfig:
    return StreamMinibatchConfig(groups_per_batch=groups_per_batch, num_minibatches=num_minibatches)


def _run(
    config: TrainConfig, dataset: ScriptedDataset, service: FakeServiceClient | None = None
) -> tuple[FakeServiceClient, Any]:
    service = FakeServiceClient() if service is None else service
    return service, asyncio.run(train(config, dataset=dataset, service_client=service))


def test_a_minibatch_trains_as_soon_as_its_groups_arrive(tmp_path: Path) -> None:
    log: list[tuple[Any, ...]] = []
    # problems 0, 1 finish at once; 2, 3 take 50 ms: the first minibatch must not wait for them
    dataset = ScriptedDataset(
        lambda b, p: _Group(b, p, log=log, latency=0.05 if p >= 2 else 0.0),
        num_batches=2,
        groups_per_batch=4,
    )
    service = FakeServiceClient()
    service.events = log  # one ordered log: training calls and group cleanups
    _, result = _run(
        _config(tmp_path, max_steps=1, stream_minibatch_config=_stream(4, 2)), dataset, service
    )
    calls = [
        e[:2] if e[0] == "done" else e[0]
        for e in log
        if e[0] in ("done", "forward_backward", "optim_step")
    ]
    # each fast group's datums (2 trajectories each) in the first minibatch, sent before the
    # slow groups finished; one optim_step after the substep's two forward_backward calls
    assert calls[:3] == [("done", 0), ("done", 0), "forward_backward"]
    fb = [e for e in log if e[0] == "forward_backward"]
    assert [e[1] for e in fb] == [4, 4]
    assert calls.index("forward_backward") < [i for i, c in enumerate(calls) if c == ("done", 0)][2]
    assert calls[-1] == "optim_step" and calls.count("optim_step") == 1
    assert result.end_step == 1 and result.skipped_steps == ()
    row = result.last_metrics
    for key in (
        "time/train/fwd_bwd_substep_0_mb_0_enqueue",
        "time/train/fwd_bwd_substep_0_mb_1_consume",
        "time/train/optim_substep_0_enqueue",
        "time/train/optim_substep_0_consume",
        "sampling_client/step_max",
        "time/sampling_time_mean",
        "progress/batch",
        "env/all/reward/total",
    ):
        assert key in row, key
    assert row["batch/num_trained_groups"] == 4 and row["batch/num_datums"] == 8


def test_groups_are_trained_in_the_order_they_finish(tmp_path: Path) -> None:
    log: list[tuple[Any, ...]] = []
    # reverse latencies: problem 3 finishes first, problem 0 last
    dataset = ScriptedDataset(
        lambda b, p: _Group(b, p, log=log, latency=0.04 * (3 - p)),
        num_batches=1,
        groups_per_batch=4,
    )
    service, _ = _run(_config(tmp_path, stream_minibatch_config=_stream(4, 4)), dataset)
    trained = service.training_clients[0].sent_data
    assert [len(chunk) for chunk in trained] == [2, 2, 2, 2]
    prompts = [chunk[0].model_input.to_ints()[2] for chunk in trained]
    assert prompts == [6, 5, 4, 3]  # prompt [1, 2, 3 + problem]


def test_substeps_each_end_with_one_optim_step(tmp_path: Path) -> None:
    log: list[tuple[Any, ...]] = []
    dataset = ScriptedDataset(lambda b, p: _Group(b, p, log=log), num_batches=2, groups_per_batch=4)
    service, result = _run(
        _config(tmp_path, num_substeps=2, stream_minibatch_config=_stream(4, 2)), dataset
    )
    calls = [e[0] for e in service.events if e[0] in ("forward_backward", "optim_step")]
    assert (
        calls == ["forward_backward", "forward_backward", "optim_step"] * 4
    )  # 2 steps x 2 substeps
    assert result.end_step == 2
    assert {"time/train/optim_substep_1_consume"} <= set(result.last_metrics)


def test_failed_and_constant_groups_hold_their_place_but_do_not_train(tmp_path: Path) -> None:
    log: list[tuple[Any, ...]] = []

    def make(b: int, p: int) -> _Group:
        return _Group(b, p, log=log, latency=0.04 * p, failing=p == 0, constant=p == 1)

    dataset = ScriptedDataset(make, num_batches=1, groups_per_batch=4)
    config = _config(
        tmp_path,
        rollout_strategy="retry",
        max_retries=0,
        remove_constant_reward_groups=True,
        stream_minibatch_config=_stream(4, 2),
    )
    service, result = _run(config, dataset)
    # minibatch 0 = problems 0 (failed) and 1 (constant): nothing to send; minibatch 1 trains 2, 3
    assert [len(c) for c in service.training_clients[0].sent_data] == [4]
    assert result.last_metrics["batch/num_trained_groups"] == 2
    assert result.last_metrics["rollout_errors/groups_skipped"] == 1


def test_a_step_with_nothing_to_train_is_skipped(tmp_path: Path) -> None:
    log: list[tuple[Any, ...]] = []
    dataset = ScriptedDataset(
        lambda b, p: _Group(b, p, log=log, constant=True), num_batches=1, groups_per_batch=2
    )
    config = _config(
        tmp_path, remove_constant_reward_groups=True, stream_minibatch_config=_stream(2, 1)
    )
    service, result = _run(config, dataset)
    assert result.skipped_steps == (0,)
    assert not any(e[0] in ("forward_backward", "optim_step") for e in service.events)
    assert result.last_metrics["tokens/cumulative/sampled"] > 0  # dropped sampling still counted


def test_a_failing_group_stops_the_step_and_every_group_cleans_up_once(tmp_path: Path) -> None:
    log: list[tuple[Any, ...]] = []
    builders: list[_Group] = []

    def make(b: int, p: int) -> _Group:
        builders.append(_Group(b, p, log=log, latency=0.0 if p == 0 else 0.5, failing=p == 0))
        return builders[-1]

    dataset = ScriptedDataset(make, num_batches=1, groups_per_batch=4)
    with pytest.raises(EnvFailure):
        _run(_config(tmp_path, stream_minibatch_config=_stream(4, 2)), dataset)
    # the last batch made is the step's (the dataset check reads batch 0 before the run)
    assert [b.cleanup_calls for b in builders[-4:]] == [1, 1, 1, 1]


def test_groups_per_batch_must_match_the_dataset_batches(tmp_path: Path) -> None:
    log: list[tuple[Any, ...]] = []
    dataset = ScriptedDataset(lambda b, p: _Group(b, p, log=log), num_batches=1, groups_per_batch=2)
    for size, word in ((4, "larger"), (1, "smaller")):
        config = _config(tmp_path, stream_minibatch_config=_stream(size, 1))
        with pytest.raises(
            ConfigError, match=f"groups_per_batch: {size} is {word} than the dataset"
        ):
            check_stream_dataset(config, dataset)


def test_train_refuses_a_bad_stream_batch_size_before_anything_runs(tmp_path: Path) -> None:
    dataset = ScriptedDataset(lambda b, p: _Group(b, p, log=[]), num_batches=1, groups_per_batch=2)
    service = FakeServiceClient()
    with pytest.raises(ConfigError, match="groups_per_batch: 4 is larger"):
        _run(_config(tmp_path, stream_minibatch_config=_stream(4, 2)), dataset, service)
    assert service.events == [] and not (tmp_path / "run" / "config.json").exists()


class _GrowingDataset(ScriptedDataset):
    """Batch `b` holds `groups_per_batch + b` groups."""

    def get_batch(self, index: int) -> Any:
        return [self.make_builder(index, p) for p in range(self.groups_per_batch + index)]


def test_a_later_batch_with_more_groups_stops_the_run_instead_of_dropping_them(
    tmp_path: Path,
) -> None:
    log: list[tuple[Any, ...]] = []
    dataset = _GrowingDataset(lambda b, p: _Group(b, p, log=log), num_batches=3, groups_per_batch=2)
    service = FakeServiceClient()
    with pytest.raises(
        ConfigError, match=r"groups_per_batch: 2 is smaller than the dataset's batch 1 \(3 groups\)"
    ):
        _run(_config(tmp_path, stream_minibatch_config=_stream(2, 1)), dataset, service)
    assert {batch for _, batch, _ in log} == {0}  # batch 1 never rolled out
    assert sum(1 for e in service.events if e[0] == "optim_step") == 1  # step 0 trained


@pytest.mark.slow  # compiles the micro model's stages (a few seconds)
def test_a_streaming_run_trains_and_resumes_on_the_local_backend(tmp_path: Path) -> None:
    import json

    from tests.local.micro import MICRO_NAME, micro_service

    log: list[tuple[Any, ...]] = []
    dataset = ScriptedDataset(lambda b, p: _Group(b, p, log=log), num_batches=3, groups_per_batch=4)

    def run(max_steps: int) -> Any:
        config = TrainConfig(
            backend="local",
            base_model=MICRO_NAME,
            log_dir=str(tmp_path / "run"),
            max_tokens=4,
            max_steps=max_steps,
            progress=False,
            stream_minibatch_config=_stream(4, 2),
        )
        service = micro_service(tmp_path / "run" / "local_states")
        return asyncio.run(train(config, dataset=dataset, service_client=service))

    first = run(2)
    assert (first.start_step, first.end_step) == (0, 2)
    resumed = run(3)
    assert (resumed.start_step, resumed.end_step) == (2, 3)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/train/fwd_bwd_substep_0_mb_1_consume" in r]
    assert [r["step"] for r in steps] == [0, 1, 2]  # two minibatches trained in every step
    assert len([e for e in log if e[0] == "done"]) == 3 * 4  # each group cleaned up once
