"""The sync loop's cookbook 0.6.1 features and semantics (`shell.training.train`), on the fakes.

Evaluation temperature, KL-reference configuration, `num_epochs`/`max_steps`, custom
evaluators and `BenchmarkResult`, `load_checkpoint_path`, `compute_post_kl`, the
`stable_reinforce` checks and the caller's rollout strategy. Differential checks against the
cookbook itself are in `tests/parity/test_loop_parity.py`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tinker

from rlpure.advantages import compute_advantages
from rlpure.packing import assemble_batch
from rlpure.records import ModelInput, TokensWithLogprobs, Trajectory, TrajectoryGroup, Transition
from rlpure.usage import TokenUsage
from shell.clients import SamplingClient
from shell.config import TrainConfig, build_config
from shell.datums import to_tinker_datums
from shell.env import EnvGroupBuilder, RLDataset
from shell.errors import ConfigError, EnvFailure
from shell.evaluation import BenchmarkResult, RLTestSetEvaluator, SamplingClientEvaluator
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
from shell.rollouts import FailFast, RetryOnFailure
from shell.training import evaluate, load_checkpoints, read_jsonl, resolve_num_steps, train
from shell.training._policy_update import check_provenance, train_step

GROUPS, GROUP_SIZE = 2, 4


def _builder(batch: int, problem: int, *, failing: bool = False) -> ScriptedGroupBuilder:
    """A group whose reward is 1 exactly when the action is the prompt's last token, which is
    what the fake sampler answers greedily (and rarely when it samples)."""
    target = 3 + (batch * 5 + problem) % 8

    def reward(action: np.ndarray) -> float:
        return float(action.tolist() == [target])

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


def _rows(log_dir: Path) -> list[dict[str, Any]]:
    """A finished run's metrics rows but its final totals row, which must be the last one."""
    rows = read_jsonl(log_dir / "metrics.jsonl")
    assert [i for i, r in enumerate(rows) if "final_totals" in r] == [len(rows) - 1]
    return rows[:-1]


def _config(log_dir: Path, **options: Any) -> TrainConfig:
    return build_config(
        {"log_dir": str(log_dir), "backend": "fake", "progress": False, "max_tokens": 4},
        options,
    )


def _train(config: TrainConfig, service: FakeServiceClient, dataset: RLDataset, **kw: Any):  # type: ignore[no-untyped-def]
    return asyncio.run(train(config, dataset=dataset, service_client=service, **kw))


def _without_times(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if not k.startswith("time/")}


# --- evaluation temperature --------------------------------------------------------------------


@pytest.mark.parametrize(("options", "expected"), [({}, 1.0), ({"eval_temperature": 0.0}, 0.0)])
def test_evaluation_samples_at_temperature_one_unless_greedy_is_asked(
    tmp_path: Path, options: dict[str, Any], expected: float
) -> None:
    sampler = FakeSamplingClient()
    config = _config(tmp_path, max_tokens=3, **options)
    asyncio.run(evaluate(_dataset(2), sampler, config=config, strategy=FailFast()))
    params = [p for _, _, p in sampler.sample_calls]
    assert len(params) == 2 * GROUPS * GROUP_SIZE
    assert {(p.temperature, p.max_tokens) for p in params} == {(expected, 3)}


def test_the_loop_evaluates_at_the_configured_temperature(tmp_path: Path) -> None:
    """Greedy answers of the fake are always right here, sampled ones rarely."""
    rewards = {}
    for name, options in (("sampled", {}), ("greedy", {"eval_temperature": 0.0})):
        config = _config(tmp_path / name, eval_every=1, max_steps=1, **options)
        _train(config, FakeServiceClient(), _dataset(1), test_dataset=_dataset(2))
        rewards[name] = [r["test/env/all/reward/total"] for r in _rows(tmp_path / name)]
    assert rewards["greedy"] == [1.0, 1.0]
    assert max(rewards["sampled"]) < 0.5


def test_evaluation_draws_no_training_seed(tmp_path: Path) -> None:
    runs = {}
    for name, test in (("with", _dataset(1)), ("without", None)):
        _train(_config(tmp_path / name, eval_every=1), FakeServiceClient(), _dataset(3),
               test_dataset=test)  # fmt: skip
        runs[name] = [
            {k: v for k, v in _without_times(r).items() if not k.startswith("test/")}
            for r in read_jsonl(tmp_path / name / "metrics.jsonl")
            if "final_eval" not in r
        ]
    assert runs["with"] == runs["without"]


# --- the KL reference --------------------------------------------------------------------------


def test_a_kl_penalty_without_a_reference_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"kl_penalty_coef: 0.1 > 0 needs a KL reference"):
        _config(tmp_path, kl_penalty_coef=0.1)
    with pytest.raises(ConfigError, match=r"kl_reference_initial_policy: true excludes"):
        _config(tmp_path, kl_penalty_coef=0.1, kl_reference_initial_policy=True,
                kl_reference_model="m")  # fmt: skip
    assert not (tmp_path / "metrics.jsonl").exists()


def test_the_kl_reference_is_opened_as_the_cookbooks_kl_reference_config(tmp_path: Path) -> None:
    store = FakeCheckpointStore()
    first = FakeServiceClient(store=store)
    _train(_config(tmp_path / "first"), first, _dataset(1))

    async def save() -> str:
        return str((await first.training_clients[0].save_weights_for_sampler("ref")).path)

    saved = asyncio.run(save())

    service = FakeServiceClient(store=store)
    config = _config(tmp_path / "run", kl_penalty_coef=0.1, kl_reference_model="base/m",
                     kl_reference_checkpoint=saved)  # fmt: skip
    _train(config, service, _dataset(1))
    assert ("create_sampling_client", "base/m", saved) in service.events
    # no KL reference saved from the policy: the one sampler save is the final checkpoint's
    # (its sampler weights, as the cookbook's final save)
    sampler_saves = [e for e in service.events if e[0] == "save_weights_for_sampler"]
    assert ("save_weights_for_sampler", "kl_reference") not in sampler_saves
    assert len(sampler_saves) == 1
    (record,) = load_checkpoints(tmp_path / "run")
    assert record.kl_reference_path is None
    assert "kl_policy_base" in read_jsonl(tmp_path / "run" / "metrics.jsonl")[0]


# --- num_epochs and max_steps ------------------------------------------------------------------


class _Recording(RLDataset):
    def __init__(self, inner: RLDataset, kill_at: int | None = None) -> None:
        self.inner, self.kill_at, self.calls = inner, kill_at, 0
        self.seen: list[int] = []

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if self.calls == self.kill_at:
            raise KeyboardInterrupt
        self.calls += 1
        self.seen.append(index)
        return self.inner.get_batch(index)

    def __len__(self) -> int:
        return len(self.inner)


def test_num_epochs_replays_the_dataset_and_max_steps_caps_it(tmp_path: Path) -> None:
    data = _Recording(_dataset(2))
    result = _train(_config(tmp_path / "a", num_epochs=3), FakeServiceClient(), data)
    assert result.end_step == 6 and data.seen == [0, 1, 0, 1, 0, 1]
    lines = _rows(tmp_path / "a")
    assert [r["step"] for r in lines] == list(range(6))
    assert lines[-1]["progress/done_frac"] == 1.0

    data = _Recording(_dataset(2))
    _train(_config(tmp_path / "b", num_epochs=3, max_steps=3), FakeServiceClient(), data)
    assert data.seen == [0, 1, 0]


def test_a_max_steps_past_the_epochs_stops_early_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="shell.training._loop"):
        result = _train(_config(tmp_path, max_steps=5), FakeServiceClient(), _dataset(2))
    assert result.end_step == 2
    assert "max_steps=5 exceeds num_epochs * len(dataset) = 1 * 2 = 2" in caplog.text
    assert resolve_num_steps(None, 0, 3) == 0
    with pytest.raises(ConfigError, match="num_epochs"):
        resolve_num_steps(None, 2, 0)
    with pytest.raises(ConfigError, match=r"TrainConfig.num_epochs: must be >= 1, got 0"):
        _config(tmp_path, num_epochs=0)


def test_a_run_killed_in_its_second_epoch_resumes_as_if_uninterrupted(tmp_path: Path) -> None:
    options = {"num_epochs": 2, "save_every": 1, "seed": 4}
    _train(_config(tmp_path / "ref", **options), FakeServiceClient(), _dataset(2))
    store = FakeCheckpointStore()
    with pytest.raises(KeyboardInterrupt):
        _train(_config(tmp_path / "run", **options), FakeServiceClient(store=store),
               _Recording(_dataset(2), kill_at=3))  # fmt: skip
    data = _Recording(_dataset(2))
    result = _train(_config(tmp_path / "run", **options), FakeServiceClient(store=store), data)
    assert (result.start_step, result.end_step, data.seen) == (3, 4, [1])
    resumed = [_without_times(r) for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")]
    assert resumed == [_without_times(r) for r in read_jsonl(tmp_path / "ref" / "metrics.jsonl")]


# --- custom evaluators -------------------------------------------------------------------------


class _VersionEvaluator(SamplingClientEvaluator):
    """Reports the version of the sampler it is given, under `key` and a shared key."""

    def __init__(self, key: str, shared: float) -> None:
        self.key, self.shared = key, shared
        self.versions: list[int] = []

    async def __call__(self, sampling_client: SamplingClient) -> dict[str, float]:
        assert isinstance(sampling_client, FakeSamplingClient)
        self.versions.append(sampling_client.version)
        return {self.key: float(sampling_client.version), "eval/shared": self.shared}


def test_evaluator_builders_run_on_the_eval_schedule_with_metrics_merged_in_order(
    tmp_path: Path,
) -> None:
    built: list[_VersionEvaluator] = []

    def builder(key: str, shared: float):  # type: ignore[no-untyped-def]
        def build() -> _VersionEvaluator:
            built.append(_VersionEvaluator(key, shared))
            return built[-1]

        return build

    config = _config(tmp_path, eval_every=2)
    _train(config, FakeServiceClient(), _dataset(3), test_dataset=_dataset(1),
           evaluator_builders=[builder("eval/a", 1.0), builder("eval/b", 2.0)])  # fmt: skip
    assert [e.key for e in built] == ["eval/a", "eval/b"]  # each built once
    assert built[0].versions == built[1].versions == [0, 2, 3]  # steps 0, 2 and after the last
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    evaluated = [r for r in lines if "eval/a" in r]
    assert [r["step"] for r in evaluated] == [0, 2, 3] and evaluated[-1]["final_eval"] == 1
    assert {r["eval/shared"] for r in evaluated} == {2.0}  # the later evaluator wins
    assert all("test/env/all/reward/total" in r for r in evaluated)


def test_evaluators_run_without_a_test_set_and_not_with_eval_every_zero(tmp_path: Path) -> None:
    evaluator = _VersionEvaluator("eval/a", 0.0)
    _train(_config(tmp_path / "a", eval_every=1), FakeServiceClient(), _dataset(2),
           evaluator_builders=[lambda: evaluator])  # fmt: skip
    assert evaluator.versions == [0, 1, 2]
    never = _VersionEvaluator("eval/a", 0.0)
    _train(_config(tmp_path / "b"), FakeServiceClient(), _dataset(2),
           evaluator_builders=[lambda: never])  # fmt: skip
    assert never.versions == []


def test_the_test_set_evaluator_fills_a_benchmark_result() -> None:
    def builder(batch: int, problem: int) -> ScriptedGroupBuilder:
        rewards = [[0.0], [1.0], [0.0]][problem]
        return ScriptedGroupBuilder(
            lambda i: ScriptedEnv(rewards=rewards, fail_at_step=0 if problem == 2 else None),
            group_size=2,
        )

    data = ScriptedDataset(builder, num_batches=1, groups_per_batch=3)
    evaluator = RLTestSetEvaluator(data, max_tokens=4, name="val",
                                   strategy=RetryOnFailure(max_retries=0))  # fmt: skip
    metrics = asyncio.run(evaluator(FakeSamplingClient()))
    assert metrics["val/num_groups"] == 2.0 and metrics["val/env/all/reward/total"] == 0.5
    assert metrics["val/rollout_errors/groups_skipped"] == 1.0
    result = evaluator.last_result
    assert isinstance(result, BenchmarkResult)
    assert (result.name, result.num_examples, result.num_correct, result.num_errors) == (
        "val", 3, 1, 1,
    )  # fmt: skip
    assert result.score == pytest.approx(1 / 3) and result.score_completed == 0.5
    assert result.metrics["env/all/reward/total"] == 0.5


# --- load_checkpoint_path ----------------------------------------------------------------------


def test_load_checkpoint_path_starts_a_fresh_run_from_those_weights(tmp_path: Path) -> None:
    store = FakeCheckpointStore()
    _train(_config(tmp_path / "first", max_steps=2), FakeServiceClient(store=store), _dataset(2))
    (state,) = [r.state_path for r in load_checkpoints(tmp_path / "first")]

    service = FakeServiceClient(store=store)
    config = _config(tmp_path / "second", load_checkpoint_path=state, save_every=1)
    with pytest.raises(KeyboardInterrupt):
        _train(config, service, _Recording(_dataset(3), kill_at=2))
    creates = [e for e in service.events if e[0].startswith("create_training")]
    assert creates == [("create_training_client_from_state", state)]
    assert "create_lora_training_client" not in [e[0] for e in service.events]
    # the rollouts of its first step sample from the loaded weights (2 optimizer steps)
    assert next(e for e in service.events if e[0] == "sample")[1] == 2

    last = load_checkpoints(tmp_path / "second")[-1]
    resumed = FakeServiceClient(store=store)
    _train(config, resumed, _dataset(3))  # a resume restores its own checkpoint instead
    creates = [e for e in resumed.events if e[0].startswith("create_training")]
    assert creates == [("create_training_client_from_state_with_optimizer", last.state_path)]


# --- compute_post_kl ---------------------------------------------------------------------------


def test_compute_post_kl_logs_the_kl_between_sampler_and_updated_policy(tmp_path: Path) -> None:
    _train(_config(tmp_path / "on", compute_post_kl=True), FakeServiceClient(), _dataset(2))
    _train(_config(tmp_path / "off"), FakeServiceClient(), _dataset(2))
    for record in _rows(tmp_path / "on"):
        # fake sampling logprobs are -log(V), its scored ones -log(V) - 0.1
        assert record["kl_pre_post_v1"] == pytest.approx(0.1, abs=1e-6)
        assert record["kl_pre_post_v2"] == pytest.approx(0.005, abs=1e-6)
    assert all("kl_pre_post_v1" not in r for r in read_jsonl(tmp_path / "off" / "metrics.jsonl"))


# --- stable_reinforce --------------------------------------------------------------------------


def test_stable_reinforce_is_checked_at_config_time(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"loss_fn: is a Tinker loss the local backend does not"):
        build_config({"log_dir": str(tmp_path), "loss_fn": "stable_reinforce"})
    with pytest.raises(ConfigError, match=r"kl_discount: 0.5 > 0 is not supported with loss_fn"):
        _config(tmp_path, loss_fn="stable_reinforce", kl_penalty_coef=0.1,
                kl_reference_model="m", kl_discount=0.5)  # fmt: skip
    _config(tmp_path, loss_fn="stable_reinforce", kl_discount=0.5)  # no penalty: nothing spread
    _config(
        tmp_path, backend="tinker", base_model="Qwen/Qwen3.5-9B-Base", loss_fn="stable_reinforce"
    )


class _StabilityRecording(FakeTrainingClient):
    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.stability: list[bool] = []

    def save_weights_and_get_sampling_client(self, *args: Any, **kw: Any) -> FakeFuture[Any]:
        self.stability.append(kw.get("record_stability_info", False))
        return super().save_weights_and_get_sampling_client(*args, **kw)


def test_stable_reinforce_trains_with_provenance_and_stability_info(tmp_path: Path) -> None:
    service = FakeServiceClient()
    client = _StabilityRecording(base_model="m", rank=4, store=service.store, events=service.events)
    _train(_config(tmp_path, loss_fn="stable_reinforce"), service, _dataset(2),
           training_client=client)  # fmt: skip
    assert client.stability == [True, True, True]
    assert [e[2] for e in service.events if e[0] == "forward_backward"] == ["stable_reinforce"] * 2
    sent = [d for chunk in client.sent_data for d in chunk]
    assert sent and all(d.loss_fn_input_spans is not None for d in sent)


def test_stable_reinforce_refuses_datums_without_provenance_before_sending() -> None:
    def traj(tokens: list[int], reward: float) -> Trajectory:
        ac = TokensWithLogprobs(tokens=np.asarray(tokens), logprobs=np.full(len(tokens), -0.5))
        step = Transition(ob=ModelInput.from_ints([1, 2]), ac=ac, reward=reward, episode_done=True)
        return Trajectory(transitions=(step,))

    group = TrajectoryGroup(trajectories_G=(traj([5], 1.0), traj([6], 0.0)),
                            final_rewards_G=(0.0, 0.0), metrics_G=({}, {}))  # fmt: skip
    datums = to_tinker_datums(assemble_batch([group], compute_advantages([group])))
    check_provenance(datums, "importance_sampling")  # other losses need none
    events: list[tuple[Any, ...]] = []
    client = FakeTrainingClient(base_model="m", rank=4, store=FakeCheckpointStore(), events=events)
    with pytest.raises(ValueError, match=r"stable_reinforce' needs provenance .* datum 0 has none"):
        asyncio.run(train_step(client, datums, adam_params=tinker.AdamParams(learning_rate=1e-3),
                               loss_fn="stable_reinforce"))  # fmt: skip
    assert events == []


# --- the caller's strategy ---------------------------------------------------------------------


def test_train_takes_the_callers_rollout_strategy(tmp_path: Path) -> None:
    data = _dataset(2, failing_batches=[1])
    with pytest.raises(EnvFailure):
        _train(_config(tmp_path / "a"), FakeServiceClient(), data)
    result = _train(_config(tmp_path / "b"), FakeServiceClient(), data,
                    strategy=RetryOnFailure(max_retries=0))  # fmt: skip
    assert result.skipped_steps == (1,)


def test_fail_fast_with_a_rollout_timeout_stops_a_run_whose_env_hangs(tmp_path: Path) -> None:
    """fail_fast used to refuse rollout_timeout, so a hung env hung the run."""

    def builder(batch: int, problem: int) -> ScriptedGroupBuilder:
        hang = 0 if batch == 1 and problem == 0 else None
        return ScriptedGroupBuilder(lambda i: ScriptedEnv(hang_at_step=hang), group_size=2)

    data = ScriptedDataset(builder, num_batches=2, groups_per_batch=2)
    config = _config(tmp_path, rollout_strategy="fail_fast", rollout_timeout=0.2)
    with pytest.raises(TimeoutError):
        _train(config, FakeServiceClient(), data)
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [0]


# --- termination -------------------------------------------------------------------------------


def test_the_termination_policy_clamps_limit_stopped_rewards_in_training_only(
    tmp_path: Path,
) -> None:
    """`config.termination` reaches the training rollouts (the cookbook's sync loop passes
    `config.effective_termination()`; its test-set evaluator applies none)."""

    def builder(batch: int, problem: int) -> ScriptedGroupBuilder:
        def make(i: int) -> ScriptedEnv:
            limited = {"stop/max_tokens": 1.0} if i % 2 else {}
            return ScriptedEnv(rewards=[1.0], metrics=limited)

        return ScriptedGroupBuilder(make, group_size=2)

    data = ScriptedDataset(builder, num_batches=1, groups_per_batch=2)
    rewards = {}
    for name, options in (
        ("none", {}),
        ("clamp", {"termination": {"zero_reward_on_limit": True}}),
    ):
        config = _config(tmp_path / name, eval_every=1, **options)
        _train(config, FakeServiceClient(), data, test_dataset=data)
        step, _ = _rows(tmp_path / name)
        rewards[name] = (step["env/all/reward/total"], step["test/env/all/reward/total"])
    assert rewards["none"] == (1.0, 1.0)
    assert rewards["clamp"] == (0.5, 1.0)  # the limit-stopped half gets min(1.0, 0.0)
    assert build_config({"base_model": "rlpure/tiny"}).effective_termination() is None
    with pytest.raises(ConfigError, match=r"TrainConfig.termination: .*grader_timeout_seconds"):
        _config(tmp_path, termination={"grader_timeout_seconds": -1.0})


def test_the_termination_config_mirrors_the_termination_policy() -> None:
    import chz

    from shell.config import TerminationConfig
    from shell.rollouts import TerminationRewardPolicy, agentic

    assert set(TerminationConfig.__struct_fields__) == set(chz.chz_fields(TerminationRewardPolicy))
    assert TerminationConfig().policy() == TerminationRewardPolicy()
    preset = agentic().termination
    assert preset is not None and TerminationConfig.from_policy(preset).policy() == preset


def test_a_run_without_steps_does_not_evaluate(tmp_path: Path) -> None:
    """The cookbook evaluates the final weights only when a step ran (`start < end`)."""
    evaluator = _VersionEvaluator("eval/a", 0.0)
    result = _train(_config(tmp_path, eval_every=1), FakeServiceClient(), _dataset(0),
                    test_dataset=_dataset(1), evaluator_builders=[lambda: evaluator])  # fmt: skip
    assert result.end_step == 0 and evaluator.versions == []
    zeros = TokenUsage()  # only the final totals row, as the cookbook's (it logs it regardless)
    assert read_jsonl(tmp_path / "metrics.jsonl") == [
        {
            "step": 0,
            "final_totals": 1,
            **zeros.metrics("tokens/cumulative"),
            **zeros.metrics("tokens/discarded"),
        }
    ]
