"""Tests for the training loop (`shell.training`), its logs and checkpoints, against SDK fakes."""

from __future__ import annotations

import asyncio
import doctest
import inspect
import io
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import tinker
from rich.console import Console

import shell.rollouts
from rlpure.advantages import compute_advantages
from rlpure.packing import assemble_batch
from rlpure.records import ModelInput, TokensWithLogprobs, Trajectory, TrajectoryGroup, Transition
from shell.cli import summary_line
from shell.clients import TrainingClient
from shell.config import TrainConfig, build_config, config_to_dict
from shell.datums import to_tinker_datums
from shell.env import EnvGroupBuilder, RLDataset
from shell.errors import CheckpointError, ConfigError, EnvFailure
from shell.fakes import (
    FakeCheckpointStore,
    FakeFuture,
    FakeSamplingClient,
    FakeServiceClient,
    FakeTrainingClient,
    ScriptedDataset,
    ScriptedEnv,
    ScriptedGroupBuilder,
)
from shell.training import (
    CHECKPOINTS_FILE,
    TrainResult,
    _logs,
    _loop,
    _policy_update,
    last_checkpoint,
    load_checkpoints,
    open_training_client,
    train,
)
from shell.training._logs import (
    RunProgress,
    eval_metric_before_after,
    format_progress_line,
    plot_reward_curve,
    read_jsonl,
    truncate_jsonl_by_step,
)
from shell.training._policy_update import (
    PolicyUpdate,
    reference_logprobs_D_T,
    split_into_substeps,
    train_on_groups,
    train_step,
)

GROUPS, GROUP_SIZE = 3, 4


def _builder(batch: int, problem: int, *, failing: bool = False) -> ScriptedGroupBuilder:
    target = 3 + (batch * 7 + problem) % 8

    def reward(action: np.ndarray) -> float:
        return float(np.mean(action == target)) if len(action) else 0.0

    def make(_: int) -> ScriptedEnv:
        return ScriptedEnv(
            prompt=[1, 2, target], reward_fn=reward, stop=(), fail_at_step=0 if failing else None
        )

    return ScriptedGroupBuilder(make, group_size=GROUP_SIZE, tags=("toy",))


def _dataset(num_batches: int, *, failing_batches: Sequence[int] = ()) -> ScriptedDataset:
    return ScriptedDataset(
        lambda b, p: _builder(b, p, failing=b in failing_batches),
        num_batches=num_batches,
        groups_per_batch=GROUPS,
    )


def _config(log_dir: Path, **options: Any) -> TrainConfig:
    return build_config(
        {"log_dir": str(log_dir), "backend": "fake", "progress": False, "max_tokens": 4},
        options,
    )


def _train(config: TrainConfig, service: FakeServiceClient, dataset: RLDataset, **kw: Any):  # type: ignore[no-untyped-def]
    return asyncio.run(train(config, dataset=dataset, service_client=service, **kw))


def test_a_gspo_run_sends_its_sampled_tokens_as_the_sequence_ratio_mask(tmp_path: Path) -> None:
    # Tinker's gspo requires `sequence_ratio_mask`; the loop used to send none, so a gspo run
    # failed at its first batch
    service = FakeServiceClient()
    config = _config(
        tmp_path,
        loss_fn="gspo",
        loss_fn_config={"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    )
    _train(config, service, _dataset(1))
    sent = [d for client in service.training_clients for c in client.sent_data for d in c]
    assert sent
    for datum in sent:
        inputs = datum.loss_fn_inputs
        assert "mask" not in inputs
        mask = inputs["sequence_ratio_mask"].to_numpy()
        np.testing.assert_array_equal(mask, inputs["logprobs"].to_numpy() != 0)


def _metric_lines(log_dir: Path, *, finished: bool = True) -> list[dict[str, Any]]:
    """The metrics rows but the final totals row, which a `finished` run writes once, last
    (its running totals: those of the final checkpoint), and an unfinished one never."""
    lines = read_jsonl(log_dir / "metrics.jsonl")
    totals = [i for i, r in enumerate(lines) if "final_totals" in r]
    if not finished:
        assert totals == []
        return lines
    assert totals == [len(lines) - 1]
    final = load_checkpoints(log_dir)[-1]
    assert final.final
    assert lines[-1] == {
        "step": final.step,
        "final_totals": 1,
        **final.cumulative_tokens.metrics("tokens/cumulative"),
        **final.discarded_tokens.metrics("tokens/discarded"),
    }
    return lines[:-1]


def _without_times(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if not k.startswith("time/")}


# --- the loop end to end -----------------------------------------------------------------------


def test_loop_runs_end_to_end_against_the_fake_backend(tmp_path: Path) -> None:
    log_dir = tmp_path / "run"
    config = _config(
        log_dir,
        eval_every=2,
        save_every=2,
        num_substeps=2,
        kl_penalty_coef=0.1,
        kl_reference_initial_policy=True,
        learning_rate=1e-4,
        num_groups_to_log=1,
    )
    service = FakeServiceClient()
    result = _train(config, service, _dataset(4), test_dataset=_dataset(1))

    assert isinstance(result, TrainResult)
    assert (result.start_step, result.end_step, result.skipped_steps) == (0, 4, ())
    lines = _metric_lines(log_dir)
    assert [r["step"] for r in lines] == [0, 1, 2, 3, 4]  # 4 = the final evaluation
    for record in lines[:4]:
        assert 0.0 <= record["env/all/reward/total"] <= 1.0
        assert record["batch/num_datums"] == GROUPS * GROUP_SIZE
        assert record["optim/kl_sample_train_v1"] == pytest.approx(0.0, abs=1e-6)
        assert "kl_policy_base" in record and "train/loss:sum" in record
    assert [("test/env/all/reward/total" in r) for r in lines] == [True, False, True, False, True]
    assert lines[4]["final_eval"] == 1
    assert [r.step for r in load_checkpoints(log_dir)] == [2, 4]
    assert load_checkpoints(log_dir)[-1].final
    assert (log_dir / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    samples = read_jsonl(log_dir / "samples.jsonl")
    assert len(samples) == 4 * GROUP_SIZE  # one group per step
    assert samples[0]["turns"][0]["ob"] == "1 2 3"  # token ids without a tokenizer
    assert json.loads((log_dir / "config.json").read_text()) == config_to_dict(config)

    (training_client,) = service.training_clients
    calls = [e for e in service.events if e[0] in ("forward_backward", "optim_step")]
    assert len(calls) == 4 * 2 * 2  # 4 steps x 2 substeps x (forward_backward, optim_step)
    for event in calls:
        if event[0] == "forward_backward":
            assert event[1:] == (GROUPS * GROUP_SIZE // 2, "importance_sampling", None)
        else:
            assert event[1] == tinker.AdamParams(
                learning_rate=1e-4, beta1=0.9, beta2=0.95, eps=1e-8
            )
    for data in training_client.sent_data:
        for datum in data:
            assert set(datum.loss_fn_inputs) == {"target_tokens", "logprobs", "advantages"}
    # rollouts of step i sample from the weights after i optimizer-step pairs
    train_versions = [e[1] for e in service.events if e[0] == "sample" and e[1] >= 0]
    assert sorted(set(train_versions)) == [0, 2, 4, 6, 8]
    assert train_versions == sorted(train_versions)


def test_each_step_submits_every_call_before_awaiting_any(tmp_path: Path) -> None:
    service = FakeServiceClient()
    _train(_config(tmp_path / "run", num_substeps=2), service, _dataset(2))
    events = [e for e in service.events if e[0] in ("forward_backward", "optim_step", "await")]
    events = [
        e
        for e in events
        if e[0] != "await" or e[1].split("#")[0] in ("forward_backward", "optim_step")
    ]
    kinds = [e[0] if e[0] != "await" else "await " + e[1] for e in events]
    submits = ["forward_backward", "optim_step", "forward_backward", "optim_step"]
    assert kinds == [
        *submits,
        "await forward_backward#1", "await optim_step#2",
        "await forward_backward#3", "await optim_step#4",
        *submits,
        "await forward_backward#5", "await optim_step#6",
        "await forward_backward#7", "await optim_step#8",
    ]  # fmt: skip


def test_train_step_splits_datums_into_contiguous_substeps() -> None:
    # the cookbook's split_list: longer slices last (rlpure used to put them first, [3, 2, 2])
    assert split_into_substeps(list(range(7)), 3) == [[0, 1], [2, 3], [4, 5, 6]]
    assert split_into_substeps(list(range(5)), 2) == [[0, 1], [2, 3, 4]]
    assert split_into_substeps([1, 2], 5) == [[1], [2]]
    assert split_into_substeps([], 2) == []
    with pytest.raises(ValueError, match="num_substeps"):
        split_into_substeps([1], 0)


def _groups() -> list[TrajectoryGroup]:
    def traj(tokens: list[int], reward: float) -> Trajectory:
        ac = TokensWithLogprobs(
            tokens=np.asarray(tokens), logprobs=np.full(len(tokens), -0.5, np.float32)
        )
        step = Transition(ob=ModelInput.from_ints([1, 2]), ac=ac, reward=reward, episode_done=True)
        return Trajectory(transitions=(step,))

    return [
        TrajectoryGroup(
            trajectories_G=(traj([5, 6, 7], 1.0), traj([8], 0.0)),
            final_rewards_G=(0.0, 0.0),
            metrics_G=({}, {}),
        ),
        TrajectoryGroup(
            trajectories_G=(traj([9, 10], 0.0), traj([11], 1.0), traj([12, 13], 1.0)),
            final_rewards_G=(0.0, 0.0, 0.0),
            metrics_G=({}, {}, {}),
        ),
    ]


def test_train_step_sends_exactly_these_calls() -> None:
    groups = _groups()
    batch = assemble_batch(groups, compute_advantages(groups))
    datums = to_tinker_datums(batch, include_mask=False)
    events: list[tuple[Any, ...]] = []
    client = FakeTrainingClient(base_model="m", rank=8, store=FakeCheckpointStore(), events=events)
    adam = tinker.AdamParams(learning_rate=1e-3, beta1=0.9, beta2=0.95, eps=1e-8)
    out = asyncio.run(
        train_step(
            client,
            datums,
            adam_params=adam,
            loss_fn="ppo",
            loss_fn_config={"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
            num_substeps=2,
        )
    )
    config = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    assert events == [
        ("forward_backward", 2, "ppo", config),
        ("optim_step", adam),
        ("forward_backward", 3, "ppo", config),
        ("optim_step", adam),
        ("await", "forward_backward#1"),
        ("await", "optim_step#2"),
        ("await", "forward_backward#3"),
        ("await", "optim_step#4"),
    ]
    assert [d for chunk in client.sent_data for d in chunk] == datums
    assert len(out.forward_backward) == len(out.optim_step) == 2
    first = client.sent_data[0][0]
    assert first.model_input.to_ints() == [1, 2, 5, 6]
    assert first.loss_fn_inputs["target_tokens"].tolist() == [2, 5, 6, 7]
    assert first.loss_fn_inputs["advantages"].tolist() == [0.0, 0.5, 0.5, 0.5]
    assert first.loss_fn_inputs["logprobs"].tolist() == [0.0, -0.5, -0.5, -0.5]


def test_the_loop_calls_the_real_sdk_methods_with_matching_signatures() -> None:
    """Every SDK call the loop makes binds to tinker 0.38's real, non-deprecated methods."""
    prompt = tinker.ModelInput.from_ints([1, 2])
    params = tinker.SamplingParams(max_tokens=4)
    adam = tinker.AdamParams(learning_rate=1e-4)
    calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = [
        (tinker.ServiceClient.create_lora_training_client, (), {"base_model": "m", "rank": 32}),
        (tinker.ServiceClient.create_training_client_from_state_with_optimizer, ("p",), {}),
        (tinker.ServiceClient.create_sampling_client, (), {"base_model": "m"}),
        (tinker.ServiceClient.create_sampling_client, (), {"model_path": "tinker://x"}),
        (tinker.TrainingClient.save_weights_for_sampler, ("kl_reference",), {}),
        (tinker.TrainingClient.forward_backward, ([], "importance_sampling", None), {}),
        (tinker.TrainingClient.optim_step, (adam,), {}),
        (tinker.TrainingClient.save_state, ("step_000002",), {}),
        (tinker.TrainingClient.save_weights_and_get_sampling_client, (), {}),
        (
            tinker.SamplingClient.sample,
            (),
            {"prompt": prompt, "num_samples": 1, "sampling_params": params},
        ),
        (tinker.SamplingClient.compute_logprobs, (prompt,), {}),
    ]
    for method, args, kwargs in calls:
        inspect.signature(method).bind(None, *args, **kwargs)
        assert getattr(method, "__deprecated__", None) is None, method.__qualname__


def test_reference_logprobs_are_aligned_with_the_targets() -> None:
    class ByToken(FakeSamplingClient):
        """A reference whose logprob of token `x` is `-x / 100` (None for the first)."""

        def compute_logprobs(
            self, prompt: tinker.ModelInput, prompt_logprobs_last_n: int | None = None
        ) -> FakeFuture[list[float | None]]:
            tokens = prompt.to_ints()
            logprobs: list[float | None] = [None, *(-t / 100 for t in tokens[1:])]
            return FakeFuture(logprobs, events=self.events, label="compute_logprobs")

    groups = _groups()
    batch = assemble_batch(groups, compute_advantages(groups))
    ref_D_T = asyncio.run(reference_logprobs_D_T(ByToken(), batch))
    assert ref_D_T.shape == batch.shape
    for d in range(batch.num_datums):
        length = int(batch.length_D[d])
        np.testing.assert_allclose(
            ref_D_T[d, :length], -np.asarray(batch.target_tokens_D_T)[d, :length] / 100, rtol=1e-6
        )
        assert not ref_D_T[d, length:].any()


def _constant_groups() -> list[TrajectoryGroup]:
    """`_groups()` with every reward 1: no group carries a signal under centring."""
    return [
        TrajectoryGroup(
            trajectories_G=tuple(
                Trajectory(transitions=(msgspec.structs.replace(t.transitions[0], reward=1.0),))
                for t in g.trajectories_G
            ),
            final_rewards_G=g.final_rewards_G,
            metrics_G=g.metrics_G,
        )
        for g in _groups()
    ]


def _update_of(
    groups: list[TrajectoryGroup], **options: Any
) -> tuple[PolicyUpdate, FakeServiceClient]:
    service = FakeServiceClient()

    async def run() -> PolicyUpdate:
        client = await service.create_lora_training_client("m")
        config = _config(Path("unused"), **options)
        reference = (
            await service.create_sampling_client(base_model="m")
            if config.kl_penalty_coef > 0
            else None
        )
        return await train_on_groups(
            groups,
            training_client=client,
            kl_reference_client=reference,
            config=config,
            adam_params=tinker.AdamParams(learning_rate=1e-3),
        )

    return asyncio.run(run()), service


def test_train_on_groups_returns_the_new_sampler_and_its_metrics() -> None:
    update, service = _update_of(_groups(), kl_penalty_coef=0.1, kl_reference_model="m")
    assert isinstance(update, PolicyUpdate)
    assert isinstance(update.sampling_client, FakeSamplingClient)
    assert update.sampling_client.version == 1  # the weights after this update's optim_step
    assert [e[0] for e in service.events].count("optim_step") == 1
    assert list(update.metrics)[:3] == [
        "kl_policy_base",
        "batch/num_datums",
        "batch/num_trained_groups",
    ]
    assert (
        update.metrics["batch/num_datums"] == 5 and update.metrics["batch/num_trained_groups"] == 2
    )
    assert update.metrics["train/loss:sum"] > 0 and update.metrics["optim/step"] == 1.0
    assert {"optim/kl_sample_train_v1", "optim/kl_sample_train_v2", "optim/entropy"} <= set(
        update.metrics
    )
    # the fake's training logprobs are the sampling ones: the policy has not moved
    assert update.metrics["optim/kl_sample_train_v1"] == pytest.approx(0.0, abs=1e-6)


def test_train_on_groups_trains_on_the_first_group_when_every_group_is_constant() -> None:
    """The cookbook's `remove_constant_reward_groups` keeps the first group when every group
    is constant, and its sync loop trains on it (rlpure used to skip such a step)."""
    update, service = _update_of(_constant_groups(), remove_constant_reward_groups=True)
    assert isinstance(update.sampling_client, FakeSamplingClient)
    assert update.metrics["batch/num_trained_groups"] == 1
    assert update.metrics["batch/num_datums"] == len(_constant_groups()[0].trajectories_G)
    assert [e[1] for e in service.events if e[0] == "forward_backward"] == [2]
    (sent,) = [d for chunk in service.training_clients[0].sent_data for d in chunk][:1]
    assert not np.asarray(sent.loss_fn_inputs["advantages"].data).any()


def test_train_on_groups_needs_a_reference_for_a_kl_penalty() -> None:
    service = FakeServiceClient()
    client = asyncio.run(_create(service))
    with pytest.raises(ValueError, match=r"kl_reference_client is required .*kl_penalty_coef"):
        asyncio.run(
            train_on_groups(
                _groups(),
                training_client=client,
                kl_reference_client=None,
                config=_config(Path("unused"), kl_penalty_coef=0.1, kl_reference_model="m"),
                adam_params=tinker.AdamParams(learning_rate=1e-3),
            )
        )
    assert [e for e in service.events if e[0] in ("forward_backward", "optim_step")] == []


# --- resume ------------------------------------------------------------------------------------


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


def test_a_run_killed_after_a_checkpoint_resumes_at_the_right_step(tmp_path: Path) -> None:
    options = {
        "save_every": 2,
        "kl_penalty_coef": 0.05,
        "kl_reference_initial_policy": True,
        "seed": 7,
    }
    reference_dir = tmp_path / "reference"
    _train(_config(reference_dir, **options), FakeServiceClient(), _dataset(6))

    log_dir = tmp_path / "killed"
    store = FakeCheckpointStore()
    config = _config(log_dir, **options)
    with pytest.raises(_Kill):
        _train(config, FakeServiceClient(store=store), _KilledAt(_dataset(6), 3))
    before = (log_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in before] == [0, 1, 2]  # no totals row: killed
    assert [r.step for r in load_checkpoints(log_dir)] == [2]

    service = FakeServiceClient(store=store)
    result = _train(config, service, _dataset(6))
    assert (result.start_step, result.end_step) == (2, 6)
    assert service.events[0] == (
        "create_training_client_from_state_with_optimizer",
        load_checkpoints(log_dir)[0].state_path,
    )
    after = (log_dir / "metrics.jsonl").read_text().splitlines()
    assert after[:2] == before[:2]  # lines before the checkpoint are kept byte for byte
    # the file as it was before the resume dropped step 2's row, as the cookbook keeps it
    backup = log_dir / "metrics.jsonl.pre_resume_000002"
    assert backup.read_text().splitlines() == before
    assert not list(log_dir.glob("*.tmp"))
    resumed = [json.loads(line) for line in after]
    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4, 5, 6]  # 6: the final totals row
    assert resumed == [*_metric_lines(log_dir), resumed[-1]]
    uninterrupted = read_jsonl(reference_dir / "metrics.jsonl")  # its totals row included
    assert [_without_times(r) for r in resumed] == [_without_times(r) for r in uninterrupted]
    records = load_checkpoints(log_dir)
    assert [r.step for r in records] == [2, 4, 6]
    # the KL reference saved at the start is reused, not re-saved from resumed weights
    (reference_path,) = {r.kl_reference_path for r in records}
    assert reference_path is not None and reference_path.endswith("/sampler/kl_reference")
    assert ("create_sampling_client", None, reference_path) in service.events
    # (periodic checkpoints save sampler weights too, as the cookbook's kind="both")
    assert ("save_weights_for_sampler", "kl_reference") not in service.events
    sampler_saves = [e[1] for e in service.events if e[0] == "save_weights_for_sampler"]
    assert len(sampler_saves) == 2  # the checkpoints at steps 4 and 6 (final)
    samples = read_jsonl(log_dir / "samples.jsonl")
    assert sorted({s["step"] for s in samples}) == [0, 1, 2, 3, 4, 5]
    assert len(samples) == 6 * GROUP_SIZE


def test_a_fresh_run_can_start_from_the_callers_training_client(tmp_path: Path) -> None:
    service = FakeServiceClient()
    own = asyncio.run(_create(service))
    _train(_config(tmp_path / "run"), service, _dataset(1), training_client=own)
    assert [e[0] for e in service.events].count("create_lora_training_client") == 1
    assert own.optim_steps == 1


async def _create(service: FakeServiceClient) -> FakeTrainingClient:
    return await service.create_lora_training_client(base_model="m", rank=4)


def _optim_steps(client: TrainingClient) -> int:
    """The optimizer steps behind a fake service's training client."""
    assert isinstance(client, FakeTrainingClient)
    return client.optim_steps


def test_a_fresh_run_takes_the_client_opened_by_open_training_client(tmp_path: Path) -> None:
    config = _config(tmp_path / "run")
    service = FakeServiceClient()
    opened = asyncio.run(open_training_client(config, service, None))
    assert opened.resumed_from is None
    result = _train(config, service, _dataset(2), training_client=opened)
    assert result.end_step == 2
    assert [e[0] for e in service.events if e[0].startswith("create_")] == [
        "create_lora_training_client"
    ]
    assert service.training_clients == [opened.client] and _optim_steps(opened.client) == 2


def test_a_resumed_run_takes_the_client_opened_for_its_checkpoint(tmp_path: Path) -> None:
    """Killed at step 3 (checkpoint at 2), resumed with the caller's client: the same metrics
    as an uninterrupted run, and no second training client."""
    options = {
        "save_every": 2,
        "kl_penalty_coef": 0.05,
        "kl_reference_initial_policy": True,
        "seed": 3,
    }
    reference_dir = tmp_path / "reference"
    _train(_config(reference_dir, **options), FakeServiceClient(), _dataset(5))

    config = _config(tmp_path / "killed", **options)
    store = FakeCheckpointStore()
    with pytest.raises(_Kill):
        _train(config, FakeServiceClient(store=store), _KilledAt(_dataset(5), 3))
    service = FakeServiceClient(store=store)
    checkpoint = last_checkpoint(config.log_dir)
    assert checkpoint is not None and checkpoint.step == 2
    opened = asyncio.run(open_training_client(config, service, checkpoint))
    assert opened.resumed_from == checkpoint and _optim_steps(opened.client) == 2

    result = _train(config, service, _dataset(5), training_client=opened)
    assert (result.start_step, result.end_step) == (2, 5)
    assert [e[0] for e in service.events if e[0].startswith("create_training")] == [
        "create_training_client_from_state_with_optimizer"
    ]
    assert service.training_clients == [opened.client] and _optim_steps(opened.client) == 5
    resumed = [_without_times(r) for r in _metric_lines(tmp_path / "killed")]
    assert resumed == [_without_times(r) for r in _metric_lines(reference_dir)]


def _run_with_two_checkpoints(log_dir: Path) -> tuple[TrainConfig, FakeCheckpointStore]:
    config = _config(log_dir, save_every=1)
    store = FakeCheckpointStore()
    _train(config, FakeServiceClient(store=store), _dataset(2))
    assert [r.step for r in load_checkpoints(log_dir)] == [1, 2]
    return build_config(config_to_dict(config), {"max_steps": 3}), store


def test_a_resumed_run_refuses_a_client_not_opened_for_its_checkpoint(tmp_path: Path) -> None:
    log_dir = tmp_path / "run"
    config, store = _run_with_two_checkpoints(log_dir)
    older, last = load_checkpoints(log_dir)
    service = FakeServiceClient(store=store)
    bare = asyncio.run(_create(service))
    fresh = asyncio.run(open_training_client(config, service, None))
    stale = asyncio.run(open_training_client(config, service, older))
    cases = [
        (bare, r"resuming from the step-2 checkpoint .*step_000002_final.* bare client"),
        (fresh, r"opened from no checkpoint \(a fresh run\), but the run starts from the step-2"),
        (stale, r"opened from the step-1 checkpoint .*step_000001_.*, but the run starts from "),
    ]
    metrics_before = (log_dir / "metrics.jsonl").read_bytes()
    for client, message in cases:
        with pytest.raises(ConfigError, match=message):
            _train(config, service, _dataset(3), training_client=client)
    assert [e for e in service.events if e[0] in ("forward_backward", "save_state")] == []
    assert (log_dir / "metrics.jsonl").read_bytes() == metrics_before
    assert load_checkpoints(log_dir)[-1] == last
    # the client opened for the last checkpoint is taken
    opened = asyncio.run(open_training_client(config, service, last))
    assert _train(config, service, _dataset(3), training_client=opened).start_step == 2


def test_a_fresh_run_refuses_a_client_opened_from_a_checkpoint(tmp_path: Path) -> None:
    config, store = _run_with_two_checkpoints(tmp_path / "old")
    service = FakeServiceClient(store=store)
    opened = asyncio.run(open_training_client(config, service, last_checkpoint(tmp_path / "old")))
    with pytest.raises(ConfigError, match=r"opened from the step-2 .*starts from no checkpoint"):
        _train(_config(tmp_path / "new"), service, _dataset(1), training_client=opened)
    # a bare client holding those weights starts a fresh run from them, deliberately
    result = _train(_config(tmp_path / "new"), service, _dataset(1), training_client=opened.client)
    assert (result.start_step, _optim_steps(opened.client)) == (0, 3)


def test_a_finished_run_is_not_run_again(tmp_path: Path) -> None:
    config = _config(tmp_path / "run")
    service = FakeServiceClient()
    _train(config, service, _dataset(2))
    lines = (tmp_path / "run" / "metrics.jsonl").read_text()
    again = FakeServiceClient(store=service.store)
    result = _train(config, again, _dataset(2))
    assert (result.start_step, result.end_step) == (2, 2)
    assert again.events == []
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == lines


def test_a_run_resumed_with_fewer_steps_than_its_checkpoint_does_nothing(tmp_path: Path) -> None:
    store = FakeCheckpointStore()
    with pytest.raises(_Kill):
        _train(
            _config(tmp_path / "run", save_every=2),
            FakeServiceClient(store=store),
            _KilledAt(_dataset(6), 3),
        )
    service = FakeServiceClient(store=store)
    result = _train(_config(tmp_path / "run", max_steps=1), service, _dataset(6))
    assert (result.start_step, result.end_step) == (2, 2)
    assert service.events == []
    assert [r.step for r in load_checkpoints(tmp_path / "run")] == [2]


def test_a_fresh_run_in_a_used_directory_without_checkpoints_drops_stale_metrics(
    tmp_path: Path,
) -> None:
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    (log_dir / "metrics.jsonl").write_text('{"step": 0, "stale": 1}\n{"step": 1, "stale": 1}\n')
    _train(_config(log_dir), FakeServiceClient(), _dataset(1))
    assert [("stale" in r) for r in _metric_lines(log_dir)] == [False]


# --- failures ----------------------------------------------------------------------------------


def test_a_step_where_every_group_failed_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = _config(tmp_path / "run", rollout_strategy="retry", max_retries=1)
    service = FakeServiceClient()
    with caplog.at_level(logging.WARNING, logger="shell.training._loop"):
        result = _train(config, service, _dataset(3, failing_batches=[1]))
    assert result.skipped_steps == (1,)
    assert "Step 1: every group failed" in caplog.text
    assert "; 1 step trained on nothing, every group failed: 1;" in summary_line(result)
    lines = _metric_lines(tmp_path / "run")
    assert [r["step"] for r in lines] == [0, 1, 2]
    assert lines[1]["progress/skipped"] == 1
    # running totals over the run, as the cookbook's one RolloutErrorCounter (a dropped
    # group counts as skipped, its rollout errors are not counted, see shell.rollouts)
    assert "rollout_errors/groups_skipped" not in lines[0]
    assert [lines[s]["rollout_errors/groups_skipped"] for s in (1, 2)] == [GROUPS, GROUPS]
    assert "batch/num_datums" not in lines[1]
    assert sum(e[0] == "forward_backward" for e in service.events) == 2  # steps 0 and 2 only


def test_min_viable_groups_train_on_partial_groups_and_count_errors(tmp_path: Path) -> None:
    def builder(batch: int, problem: int) -> ScriptedGroupBuilder:
        def make(i: int) -> ScriptedEnv:
            return ScriptedEnv(
                prompt=[1, 2, 3], rewards=[float(i % 2)], fail_at_step=0 if i == 0 else None
            )

        return ScriptedGroupBuilder(make, group_size=GROUP_SIZE)

    dataset = ScriptedDataset(builder, num_batches=1, groups_per_batch=GROUPS)
    config = _config(tmp_path / "run", rollout_strategy="min_viable", max_retries=0)
    _train(config, FakeServiceClient(), dataset)
    (line,) = _metric_lines(tmp_path / "run")
    assert line["rollout_errors/EnvFailure"] == GROUPS
    assert line["rollout_errors/groups_skipped"] == 0
    assert line["batch/num_datums"] == GROUPS * (GROUP_SIZE - 1)


def test_fail_fast_propagates_an_env_failure_out_of_the_loop(tmp_path: Path) -> None:
    with pytest.raises(EnvFailure):
        _train(_config(tmp_path / "run"), FakeServiceClient(), _dataset(2, failing_batches=[1]))
    assert [r["step"] for r in _metric_lines(tmp_path / "run", finished=False)] == [0]


def test_constant_reward_groups_can_be_removed_before_training(tmp_path: Path) -> None:
    def builder(batch: int, problem: int) -> ScriptedGroupBuilder:
        def make(i: int) -> ScriptedEnv:
            reward = float(i % 2) if problem == 0 else 1.0  # only group 0 is mixed
            return ScriptedEnv(prompt=[1, 2, 3], rewards=[reward])

        return ScriptedGroupBuilder(make, group_size=GROUP_SIZE)

    dataset = ScriptedDataset(builder, num_batches=1, groups_per_batch=GROUPS)
    config = _config(tmp_path / "run", remove_constant_reward_groups=True)
    _train(config, FakeServiceClient(), dataset)
    (line,) = _metric_lines(tmp_path / "run")
    assert line["batch/num_groups"] == GROUPS
    assert line["batch/num_trained_groups"] == 1
    assert line["batch/degenerate_groups_frac"] == pytest.approx((GROUPS - 1) / GROUPS)


def test_the_api_key_never_reaches_the_log_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "tml-SENTINEL-do-not-log-0123456789"
    monkeypatch.setenv("TINKER_API_KEY", secret)
    log_dir = tmp_path / "run"
    _train(_config(log_dir, save_every=1, eval_every=1), FakeServiceClient(), _dataset(2),
           test_dataset=_dataset(1))  # fmt: skip
    for path in log_dir.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


# --- logs and checkpoints ----------------------------------------------------------------------


def test_progress_line_matches_the_tutorial_format() -> None:
    metrics = {
        "env/all/reward/total": 0.4123,
        "batch/degenerate_groups_frac": 0.25,
        "batch/num_datums": 96,
    }
    assert (
        format_progress_line(3, metrics) == "Step  3 | reward: 0.412 | degenerate: 25% | datums: 96"
    )
    assert format_progress_line(12, {"progress/skipped": 1}).endswith("datums: - | skipped")


def test_progress_bar_and_lines_render_on_a_terminal(tmp_path: Path) -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=100)
    config = _config(tmp_path / "run", progress=True)
    _train(config, FakeServiceClient(), _dataset(2), console=console)
    text = buffer.getvalue()
    assert "Step  0 | reward: " in text and "Step  1 | reward: " in text
    assert "degenerate: " in text and f"datums: {GROUPS * GROUP_SIZE}" in text


def test_phase_lines_say_what_the_run_does_before_its_step_lines(tmp_path: Path) -> None:
    out = io.StringIO()
    config = _config(tmp_path / "run", progress=True, max_steps=3, eval_every=2)
    _train(
        config,
        FakeServiceClient(),
        _dataset(3),
        console=Console(file=out),
        test_dataset=_dataset(1),
    )
    lines = out.getvalue().splitlines()
    assert lines[0] == "compiling and running the first step…"
    assert lines[1].startswith("Step  0 | ")
    assert lines[2].startswith("Step  1 | ")  # "training" changes the bar's label only
    assert lines[3] == "evaluating on the test set, then step 2…"
    assert lines[4].startswith("Step  2 | ")
    assert lines[5] == "final evaluation on the test set…"


def test_the_step_counter_is_advanced_before_the_step_line_is_printed() -> None:
    progress = RunProgress(total=2, console=Console(file=io.StringIO()))
    seen: list[float] = []
    progress.console.print = lambda *a, **k: seen.append(  # type: ignore[method-assign]
        progress._progress.tasks[0].completed
    )
    progress.step_done(0, {"env/all/reward/total": 1.0})
    assert seen == [1]
    progress.phase("evaluating")
    progress.phase("evaluating")  # unchanged: no second line
    assert seen == [1, 1]


def test_reward_curve_draws_train_on_top_with_whole_step_ticks(tmp_path: Path) -> None:
    rows = [{"step": s, "env/all/reward/total": 1.0, "test/env/all/correct": 1.0} for s in range(3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    import matplotlib.figure

    drawn: list[Any] = []
    original = matplotlib.figure.Figure.savefig

    def keep(fig: Any, *args: Any, **kwargs: Any) -> None:
        drawn.append(fig)
        original(fig, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(matplotlib.figure.Figure, "savefig", keep)
        assert plot_reward_curve(tmp_path / "metrics.jsonl", tmp_path / "c.png") is not None
    (ax,) = drawn[0].axes
    by_label = {line.get_label(): line.get_zorder() for line in ax.get_lines()}
    train = by_label["train reward (mean total)"]
    assert all(train > z for label, z in by_label.items() if not label.startswith("train"))
    ticks = [tick for tick in ax.get_xticks() if 0 <= tick <= 2]
    assert ticks and all(float(tick).is_integer() for tick in ticks)


def test_truncation_keeps_earlier_lines_and_drops_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"step": 0, "a": 1}\n{"step": 1, "a": 2}\n{"step": 2, "a": 3}\n{"step": 3, "a"'
    )
    assert truncate_jsonl_by_step(path, keep_below=2) == 2
    assert path.read_text() == '{"step": 0, "a": 1}\n{"step": 1, "a": 2}\n'
    assert not (tmp_path / "metrics.jsonl.tmp").exists()
    assert truncate_jsonl_by_step(path, keep_below=5) == 0
    assert truncate_jsonl_by_step(tmp_path / "missing.jsonl", keep_below=0) == 0


def test_eval_metric_before_after_reads_step_zero_and_the_last_final_eval(
    tmp_path: Path,
) -> None:
    path = tmp_path / "metrics.jsonl"
    key = "test/env/all/correct"
    rows = [
        {"step": 0, key: 0.25},
        {"step": 1, "reward": 1.0},  # no eval this step
        {"step": 2, key: 0.5},
        {"step": 3, key: 0.7, "final_eval": True},  # a first run's end, since resumed
        {"step": 5, key: 0.75, "final_eval": True},
        {"step": 5, "tokens/cumulative/sampled": 9},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert eval_metric_before_after(path, key) == (0.25, 0.75)
    assert eval_metric_before_after(path, "test/env/all/used_tool") == (None, None)
    path.write_text(json.dumps({"step": 0, key: 0.0}) + "\n")  # killed before its final eval
    assert eval_metric_before_after(path, key) == (0.0, None)
    assert eval_metric_before_after(tmp_path / "missing.jsonl", key) == (None, None)


def test_a_corrupt_line_before_the_last_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_jsonl(path)


def test_checkpoint_log_ignores_a_torn_last_line_and_rejects_corruption(tmp_path: Path) -> None:
    good = '{"step":2,"name":"s","state_path":"p","rng_key_data":[1,2]}\n'
    (tmp_path / CHECKPOINTS_FILE).write_text(good + '{"step":4,"na')
    assert [r.step for r in load_checkpoints(tmp_path)] == [2]
    (tmp_path / CHECKPOINTS_FILE).write_text('{"step":4,"na\n' + good)
    with pytest.raises(CheckpointError, match="line 1"):
        load_checkpoints(tmp_path)
    (tmp_path / CHECKPOINTS_FILE).write_text(good.replace('"step":2', '"step":-1'))
    with pytest.raises(CheckpointError):
        load_checkpoints(tmp_path)


def test_reward_curve_needs_reward_values(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "other": 1}\n')
    assert plot_reward_curve(tmp_path / "metrics.jsonl", tmp_path / "curve.png") is None
    assert not (tmp_path / "curve.png").exists()


@pytest.mark.parametrize("module", [shell.rollouts, _logs, _policy_update, _loop])
def test_docstring_examples_run(module: Any) -> None:
    assert doctest.testmod(module).failed == 0


def test_a_step_where_every_group_is_constant_trains_on_the_first_group(tmp_path):
    """As the cookbook's sync loop (rlpure used to skip the step and log num_datums 0)."""
    config = _config(tmp_path, max_steps=3, remove_constant_reward_groups=True, progress=True)
    service = FakeServiceClient()
    dataset = ScriptedDataset(
        lambda b, i: ScriptedGroupBuilder(lambda k: ScriptedEnv(rewards=[1.0]), group_size=4),
        num_batches=3,
        groups_per_batch=2,
    )
    out = io.StringIO()
    result = asyncio.run(
        train(config, dataset=dataset, service_client=service, console=Console(file=out))
    )
    assert result.skipped_steps == ()
    assert [e[1] for e in service.events if e[0] == "forward_backward"] == [4, 4, 4]
    records = _metric_lines(tmp_path)
    assert [r["batch/num_datums"] for r in records] == [4, 4, 4]
    assert [r["batch/num_trained_groups"] for r in records] == [1, 1, 1]
    assert all("progress/no_signal" not in r for r in records)
    step_lines = [line for line in out.getvalue().splitlines() if line.startswith("Step")]
    assert len(step_lines) == 3 and all(line.endswith("datums: 4") for line in step_lines)


def test_resuming_with_a_config_that_changes_training_is_refused(tmp_path):
    dataset = ScriptedDataset(
        lambda b, i: ScriptedGroupBuilder(
            lambda k: ScriptedEnv(rewards=[float(k % 2)]), group_size=2
        ),
        num_batches=4,
        groups_per_batch=2,
    )
    store = FakeCheckpointStore()
    asyncio.run(
        train(
            _config(tmp_path, max_steps=2),
            dataset=dataset,
            service_client=FakeServiceClient(store=store),
        )
    )
    with pytest.raises(ConfigError, match=r"learning_rate: 4e-05 -> 0.5.*seed: 0 -> 5"):
        asyncio.run(
            train(
                _config(tmp_path, max_steps=4, learning_rate=0.5, seed=5),
                dataset=dataset,
                service_client=FakeServiceClient(store=store),
            )
        )
    # Changing only what may change (more steps) resumes.
    result = asyncio.run(
        train(
            _config(tmp_path, max_steps=4),
            dataset=dataset,
            service_client=FakeServiceClient(store=store),
        )
    )
    assert (result.start_step, result.end_step) == (2, 4)


def test_resuming_with_changed_recipe_options_is_refused(tmp_path: Path) -> None:
    store = FakeCheckpointStore()

    def run(max_steps: int, **recipe_options: Any) -> TrainResult:
        return _train(
            _config(tmp_path, max_steps=max_steps),
            FakeServiceClient(store=store),
            _dataset(4),
            recipe_options=recipe_options,
        )

    run(2, recipe="toy", batch_size=4, data_dir="/data/a", shape=(1, 2))
    recorded = json.loads((tmp_path / "recipe_options.json").read_text())
    assert recorded == {"recipe": "toy", "batch_size": 4, "data_dir": "/data/a", "shape": [1, 2]}
    with pytest.raises(
        ConfigError,
        match=r"recipe option batch_size: 4 -> 8; recipe option data_dir: '/data/a' -> '/data/b'",
    ):
        run(4, recipe="toy", batch_size=8, data_dir="/data/b", shape=(1, 2))
    with pytest.raises(ConfigError, match=r"seed: 0 -> 1; recipe option batch_size: 4 -> 8"):
        _train(
            _config(tmp_path, max_steps=4, seed=1),
            FakeServiceClient(store=store),
            _dataset(4),
            recipe_options={"batch_size": 8},
        )
    assert [r.step for r in load_checkpoints(tmp_path)] == [2]
    # unchanged options (a tuple reads back as the recorded list) resume
    result = run(3, recipe="toy", batch_size=4, data_dir="/data/a", shape=(1, 2))
    assert (result.start_step, result.end_step) == (2, 3)


def test_recipe_options_are_not_checked_without_a_record(tmp_path: Path) -> None:
    """A log directory written before recipe options were recorded still resumes."""
    store = FakeCheckpointStore()
    _train(_config(tmp_path, max_steps=1), FakeServiceClient(store=store), _dataset(2))
    assert not (tmp_path / "recipe_options.json").exists()
    result = _train(
        _config(tmp_path, max_steps=2),
        FakeServiceClient(store=store),
        _dataset(2),
        recipe_options={"batch_size": 8},
    )
    assert result.start_step == 1
    assert json.loads((tmp_path / "recipe_options.json").read_text()) == {"batch_size": 8}
    # a fresh run without recipe options drops a record an earlier run left behind
    stale = tmp_path / "stale" / "recipe_options.json"
    stale.parent.mkdir()
    stale.write_text('{"batch_size": 2}')
    _train(_config(stale.parent), FakeServiceClient(), _dataset(1))
    assert not stale.exists()
    with pytest.raises(ConfigError, match=r"recipe_options=...\): not JSON-encodable"):
        _train(
            _config(tmp_path / "other"),
            FakeServiceClient(),
            _dataset(1),
            recipe_options={"data": object()},
        )


def test_metrics_writer_turns_numpy_and_jax_nan_into_null(tmp_path):
    import jax.numpy as jnp

    from shell.training._logs import JsonlWriter

    with JsonlWriter(tmp_path / "m.jsonl") as writer:
        writer.write({"a": np.float32("nan"), "b": jnp.asarray(float("inf")), "c": np.int64(3)})
    assert read_jsonl(tmp_path / "m.jsonl") == [{"a": None, "b": None, "c": 3}]


def test_a_resume_that_drops_no_metrics_rows_keeps_no_pre_resume_copy(tmp_path: Path) -> None:
    from shell.training._loop import _drop_logs_after

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 0}\n{"step": 1}\n')
    _drop_logs_after(tmp_path, 2, resume=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    _drop_logs_after(tmp_path, 1, resume=None)
    assert metrics.read_text() == '{"step": 0}\n'
    assert (
        tmp_path / "metrics.jsonl.pre_resume_000001"
    ).read_text() == '{"step": 0}\n{"step": 1}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "metrics.jsonl",
        "metrics.jsonl.pre_resume_000001",
    ]


def test_a_fresh_start_over_logged_steps_says_where_the_old_rows_went(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An earlier run here stopped before its first checkpoint: starting again at step 0 is
    the only choice, and the log says so (it used to be silent)."""
    from shell.training._loop import _drop_logs_after

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 0}\n{"step": 1}\n')
    with caplog.at_level(logging.WARNING):
        _drop_logs_after(tmp_path, 0, resume=None)
    assert metrics.read_text() == ""
    assert (
        tmp_path / "metrics.jsonl.pre_resume_000000"
    ).read_text() == '{"step": 0}\n{"step": 1}\n'
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path}: no checkpoint to resume from, so training starts again at step 0; the 2 "
        "metrics lines logged before are kept in metrics.jsonl.pre_resume_000000"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # nothing logged before: nothing to say
        _drop_logs_after(tmp_path, 0, resume=None)
    assert caplog.records == []


def test_evaluations_stopped_before_they_start_leave_no_unawaited_coroutine() -> None:
    """Ctrl-C while a step's evaluations are only scheduled: nothing is left that Python then
    reports as 'coroutine ... was never awaited' after rlpure's one-line message."""
    import gc
    import warnings
    from types import SimpleNamespace

    from shell.training._steps import run_evaluators

    started: list[str] = []

    async def evaluator(sampler: object) -> dict[str, float]:
        started.append("yes")
        return {"a": 1.0}

    async def test_evaluator(sampler: object, *, seed: int) -> dict[str, float]:
        started.append("test")
        return {"b": 2.0}

    ctx = SimpleNamespace(
        evaluators=[evaluator, evaluator], test_evaluator=test_evaluator, config=TrainConfig()
    )

    async def stopped_early() -> None:
        task = asyncio.ensure_future(run_evaluators(ctx, object(), 0))  # type: ignore[arg-type]
        await asyncio.sleep(0)  # it reaches its gather; the evaluations are only scheduled
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(stopped_early())
        gc.collect()
    assert started == []
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []
