"""Issue 30's options in the loop, on the fakes: the mismatch correction (a deliberately
mismatched sampler gives the masked fraction its arrays predict), DAPO's overlong shaping and
dynamic sampling, the KL penalty's estimator, and their config errors."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tinker

from shell.config import TrainConfig, build_config
from shell.env import RLDataset
from shell.errors import ConfigError
from shell.fakes import (
    FakeSamplingClient,
    FakeServiceClient,
    FakeTrainingClient,
    ScriptedDataset,
    ScriptedEnv,
    ScriptedGroupBuilder,
)
from shell.training import read_jsonl, train

VOCAB = 16
SHIFT = 2.0  # the mismatched sampler reports logprob + SHIFT on even tokens: ratio exp(-2)


class _ShiftedSampler(FakeSamplingClient):
    """Reports `-log(V) + SHIFT` for every even sampled token (the trainer's `forward` gives
    `-log(V)` for every token, so the ratio there is `exp(-SHIFT)`, 1 elsewhere)."""

    async def _sample(self, prompt, num_samples, sampling_params):  # type: ignore[no-untyped-def]
        response = await super()._sample(prompt, num_samples, sampling_params)
        shifted = []
        for seq in response.sequences:
            tokens = np.asarray(seq.tokens, np.int32)
            logprobs = np.asarray(seq.logprobs, np.float32)
            logprobs = np.where(tokens % 2 == 0, logprobs + np.float32(SHIFT), logprobs)
            shifted.append(
                tinker.SampledSequence(
                    stop_reason=seq.stop_reason,
                    sequence_id=seq.sequence_id,
                    tokens_np=tokens,
                    logprobs_np=logprobs.astype(np.float32),
                )
            )
        return tinker.SampleResponse(sequences=shifted)


class _ShiftedTrainer(FakeTrainingClient):
    sampling_client_type = _ShiftedSampler


class _ShiftedService(FakeServiceClient):
    training_client_type = _ShiftedTrainer


def _odd_count_builder(batch: int, problem: int) -> ScriptedGroupBuilder:
    """Reward: the number of odd tokens in the action (varies within a group)."""

    def make(_: int) -> ScriptedEnv:
        return ScriptedEnv(
            prompt=[1, 2, 3 + problem],
            reward_fn=lambda action: float(np.sum(action % 2)),
            stop=(),
        )

    return ScriptedGroupBuilder(make, group_size=4, tags=("toy",))


def _config(log_dir: Path, **options: Any) -> TrainConfig:
    base = {"log_dir": str(log_dir), "backend": "fake", "progress": False, "max_tokens": 4}
    return build_config(base, options)


def _train(config: TrainConfig, service: FakeServiceClient, dataset: RLDataset) -> None:
    asyncio.run(train(config, dataset=dataset, service_client=service))


def _sent(service: FakeServiceClient) -> list[list[tinker.Datum]]:
    return service.training_clients[0].sent_data


def _arrays(datum: tinker.Datum) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    inputs = datum.loss_fn_inputs
    return (
        inputs["target_tokens"].to_numpy(),
        inputs["logprobs"].to_numpy(),
        inputs["advantages"].to_numpy(),
    )


def _step_rows(log_dir: Path) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(log_dir / "metrics.jsonl") if "final_totals" not in r]


# --- mismatch correction -----------------------------------------------------------------------


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_a_mismatched_sampler_masks_the_fraction_its_arrays_predict(
    tmp_path: Path, level: str
) -> None:
    service = _ShiftedService(vocab_size=VOCAB)
    dataset = ScriptedDataset(_odd_count_builder, num_batches=2, groups_per_batch=2)
    correction = {"level": level, "mode": "mask", "cap": 3.0}
    _train(_config(tmp_path, mismatch_correction=correction), service, dataset)
    rows = _step_rows(tmp_path)
    assert len(rows) == 2 == len(_sent(service))
    forwards = [e for e in service.events if e[0] in ("forward", "forward_backward")]
    assert [e[0] for e in forwards] == ["forward", "forward_backward"] * 2  # one forward a step
    assert math.exp(-SHIFT) < 1 / 3  # a shifted token's ratio lies outside [1/cap, cap]
    for row, datums in zip(rows, _sent(service), strict=True):
        masked = total = 0
        for datum in datums:
            targets, logprobs, advantages = _arrays(datum)
            action = logprobs != 0  # observation positions carry logprob 0
            shifted = action & (targets % 2 == 0)
            # token level: the shifted tokens; sequence level: every token of a row with one
            dropped = shifted if level == "token" else action & shifted.any()
            masked += int(dropped.sum())
            total += int(action.sum())
            assert np.all(advantages[dropped] == 0.0)
        assert row["mismatch/rollout_is_masked_fraction"] == pytest.approx(masked / total)
        assert 0 < masked < total  # the scripted sampler shifts some tokens, not all


def test_the_sent_logprobs_are_the_trainers_and_metrics_keep_the_samplers(
    tmp_path: Path,
) -> None:
    """The datums carry the trainer's logprobs (the fake's forward: `-log(V)` on every
    token), so Tinker's ratio `exp(lp − logprobs)` is 1 at the pre-update weights and the
    weight is not multiplied by `p/q` again; `optim/kl_sample_train_v1` still reads the
    sampler's logprobs (`SHIFT` above the trainer's on even tokens)."""
    service = _ShiftedService(vocab_size=VOCAB)
    dataset = ScriptedDataset(_odd_count_builder, num_batches=1, groups_per_batch=2)
    correction = {"level": "token", "mode": "truncate", "cap": 3.0}
    _train(_config(tmp_path, mismatch_correction=correction), service, dataset)
    ((datums,), (row,)) = _sent(service), _step_rows(tmp_path)
    trainer = np.float32(-math.log(VOCAB))
    differences = []
    for datum in datums:
        targets, logprobs, _ = _arrays(datum)
        action = np.arange(targets.size) >= 2  # the prompt [1, 2, 3 + p] predicts 2 targets
        assert action.any() and np.all(logprobs[~action] == 0.0)
        np.testing.assert_allclose(logprobs[action], trainer, rtol=1e-6)
        differences.extend(np.where(targets[action] % 2 == 0, SHIFT, 0.0).tolist())
    assert row["optim/kl_sample_train_v1"] == pytest.approx(np.mean(differences), rel=1e-5)
    assert row["optim/kl_sample_train_v1"] > 0


def test_streaming_substeps_score_each_minibatch_after_the_previous_optim_step(
    tmp_path: Path,
) -> None:
    """Streaming: one forward per minibatch, just before its forward_backward, so substep 1's
    minibatch is scored by the weights after substep 0's optim_step (the module docstring)."""
    service = _ShiftedService(vocab_size=VOCAB)
    dataset = ScriptedDataset(_odd_count_builder, num_batches=1, groups_per_batch=2)
    config = _config(
        tmp_path,
        mismatch_correction={"level": "token", "mode": "truncate", "cap": 3.0},
        num_substeps=2,
        stream_minibatch_config={"groups_per_batch": 2, "num_minibatches": 1},
    )
    _train(config, service, dataset)
    calls = [e[0] for e in service.events if e[0] in ("forward", "forward_backward", "optim_step")]
    assert calls == ["forward", "forward_backward", "optim_step"] * 2
    (row,) = _step_rows(tmp_path)
    assert 0 < row["mismatch/rollout_is_ratio_fraction_low"] < 1  # both minibatches corrected


def test_trainer_logprobs_of_another_count_or_length_are_refused() -> None:
    from rlpure.packing import DatumBatch
    from shell.training._corrections import trainer_logprobs_D_T

    z = np.zeros((2, 4), np.float32)
    batch = DatumBatch(
        input_tokens_D_T=z.astype(np.int32),
        target_tokens_D_T=z.astype(np.int32),
        logprobs_D_T=z,
        advantages_D_T=z,
        mask_D_T=z,
        length_D=np.array([4, 3], np.int32),
        group_idx_D=np.zeros(2, np.int32),
        traj_idx_D=np.arange(2, dtype=np.int32),
        num_datums=2,
    )

    def output(*lengths: int) -> tinker.ForwardBackwardOutput:
        rows = [
            {"logprobs": tinker.TensorData.from_numpy(np.zeros(n, np.float32))} for n in lengths
        ]
        return tinker.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=rows)

    assert trainer_logprobs_D_T(output(4, 3), batch).shape == (2, 4)
    with pytest.raises(ValueError, match="returned 1 loss_fn_outputs for 2 datums"):
        trainer_logprobs_D_T(output(4), batch)
    with pytest.raises(ValueError, match="datum 1's logprobs have length 4, its targets 3"):
        trainer_logprobs_D_T(output(4, 4), batch)


def test_an_exact_sampler_changes_nothing_and_weights_are_one(tmp_path: Path) -> None:
    dataset = ScriptedDataset(_odd_count_builder, num_batches=2, groups_per_batch=2)
    plain, corrected = FakeServiceClient(vocab_size=VOCAB), FakeServiceClient(vocab_size=VOCAB)
    _train(_config(tmp_path / "plain"), plain, dataset)
    correction = {"level": "token", "mode": "truncate", "cap": 2.0}
    _train(_config(tmp_path / "on", mismatch_correction=correction), corrected, dataset)
    assert not [e for e in plain.events if e[0] == "forward"]  # off: no extra forward
    for a, b in zip(_sent(plain), _sent(corrected), strict=True):
        for x, y in zip(a, b, strict=True):
            for u, v in zip(_arrays(x), _arrays(y), strict=True):
                np.testing.assert_array_equal(u, v)
    for row in _step_rows(tmp_path / "on"):
        assert row["mismatch/rollout_is_mean"] == 1.0
        assert row["mismatch/rollout_is_masked_fraction"] == 0.0
    assert all("mismatch/rollout_is_mean" not in r for r in _step_rows(tmp_path / "plain"))


def test_truncation_scales_advantages_by_the_capped_ratio(tmp_path: Path) -> None:
    service = _ShiftedService(vocab_size=VOCAB)
    dataset = ScriptedDataset(_odd_count_builder, num_batches=1, groups_per_batch=2)
    plain = _ShiftedService(vocab_size=VOCAB)
    _train(_config(tmp_path / "plain"), plain, dataset)
    correction = {"level": "token", "mode": "truncate", "cap": 3.0}
    _train(_config(tmp_path / "on", mismatch_correction=correction), service, dataset)
    for x, y in zip(_sent(plain)[0], _sent(service)[0], strict=True):
        targets, logprobs, before = _arrays(x)
        after = _arrays(y)[2]
        shifted = (logprobs != 0) & (targets % 2 == 0)
        want = np.where(shifted, before * np.float32(math.exp(-SHIFT)), before)
        np.testing.assert_allclose(after, want, rtol=1e-6)


# --- overlong shaping --------------------------------------------------------------------------


def _constant_builder(batch: int, problem: int) -> ScriptedGroupBuilder:
    return ScriptedGroupBuilder(
        lambda _: ScriptedEnv(prompt=[1, 2, 3 + problem], rewards=(1.0,), stop=()),
        group_size=4,
        tags=("toy",),
    )


def test_overlong_shaping_penalises_long_responses_before_advantages(tmp_path: Path) -> None:
    service = FakeServiceClient(vocab_size=VOCAB)
    dataset = ScriptedDataset(_constant_builder, num_batches=2, groups_per_batch=2)
    _train(_config(tmp_path, overlong={"max_length": 3, "buffer": 2}), service, dataset)
    rows = _step_rows(tmp_path)
    for row, datums in zip(rows, _sent(service), strict=True):
        penalties = []
        for g in range(2):
            group = datums[4 * g : 4 * g + 4]
            lengths = np.array([int((_arrays(d)[1] != 0).sum()) for d in group])
            penalty = np.clip((3 - 2 - lengths) / 2, -1.0, 0.0)  # DAPO's ramp, by hand
            penalties.extend(penalty.tolist())
            centred = penalty - penalty.mean()
            for datum, want in zip(group, centred, strict=True):
                _, logprobs, advantages = _arrays(datum)
                np.testing.assert_allclose(advantages[logprobs != 0], want, atol=1e-6)
        assert row["overlong/penalty_mean"] == pytest.approx(np.mean(penalties))
        assert row["env/all/reward/total"] == 1.0  # the logged rewards are the env's


# --- KL estimator ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("estimator", "expected"),
    [("k1", 0.1), ("k2", 0.005), ("k3", math.expm1(-0.1) + 0.1)],
)
def test_the_kl_penalty_measures_tokens_with_its_estimator(
    tmp_path: Path, estimator: str, expected: float
) -> None:
    # the fake reference scores -log(V) - 0.1, the sampler -log(V): log r = -0.1 everywhere
    config = _config(
        tmp_path, kl_penalty_coef=0.5, kl_reference_model="base/m", kl_penalty_estimator=estimator
    )
    dataset = ScriptedDataset(_odd_count_builder, num_batches=1, groups_per_batch=2)
    _train(config, FakeServiceClient(vocab_size=VOCAB), dataset)
    (row,) = _step_rows(tmp_path)
    assert row["kl_policy_base"] == pytest.approx(expected, rel=1e-4)


# --- dynamic sampling --------------------------------------------------------------------------


def _mixed_where(mixed: set[tuple[int, int]]):  # type: ignore[no-untyped-def]
    """Batch `b`'s problem `p` (prompt `[1, 2, 3 + 3b + p]`) has rewards 0, 1 when `(b, p)` is
    in `mixed`, else a constant 0."""

    def builder(batch: int, problem: int) -> ScriptedGroupBuilder:
        def make(index: int) -> ScriptedEnv:
            reward = float((batch, problem) in mixed and index % 2)
            return ScriptedEnv(prompt=[1, 2, 3 + 3 * batch + problem], rewards=(reward,), stop=())

        return ScriptedGroupBuilder(make, group_size=2, tags=("toy",))

    return builder


def _trained_prompts(datums: list[tinker.Datum]) -> list[tuple[int, int]]:
    """`(batch, problem)` of each trained group (group size 2: every other datum)."""
    found = [int(d.model_input.to_ints()[2]) - 3 for d in datums[::2]]
    return [divmod(x, 3) for x in found]


def test_dynamic_sampling_draws_new_prompts_from_the_next_batches(tmp_path: Path) -> None:
    """DAPO (and verl's recipe) fill the batch with new prompts: round `k` of step `s` rolls
    out batch `(s + k) mod n`, so a step whose own prompts are constant trains others'."""
    service = FakeServiceClient(vocab_size=VOCAB)
    dataset = ScriptedDataset(
        _mixed_where({(1, 0), (1, 1), (2, 0)}), num_batches=3, groups_per_batch=2
    )
    dynamic = {"groups_per_batch": 2, "max_sampling_rounds": 3}
    _train(_config(tmp_path, dynamic_sampling=dynamic), service, dataset)
    rows = _step_rows(tmp_path)
    got = [(r["dynamic_sampling/rounds"], r["dynamic_sampling/groups_sampled"]) for r in rows]
    # step 0: batch 0 (constant), then batch 1 (2 mixed); step 1: batch 1; step 2: batch 2
    # (1 mixed), batch 0 (none), batch 1 (2 more)
    assert got == [(2, 4), (1, 2), (3, 6)]
    assert [r["dynamic_sampling/groups_kept"] for r in rows] == [2, 2, 2]
    assert [r["batch/num_groups"] for r in rows] == [4, 2, 6]  # every group sampled
    trained = [_trained_prompts(datums) for datums in _sent(service)]
    assert trained == [[(1, 0), (1, 1)], [(1, 0), (1, 1)], [(2, 0), (1, 0)]]


def test_a_resumed_dynamic_run_samples_what_the_whole_run_did(tmp_path: Path) -> None:
    from tests.shell.test_train import _without_times

    def run(log_dir: Path, service: FakeServiceClient, **options: Any) -> None:
        dataset = ScriptedDataset(
            _mixed_where({(1, 0), (1, 1), (2, 0)}), num_batches=3, groups_per_batch=2
        )
        dynamic = {"groups_per_batch": 2, "max_sampling_rounds": 3}
        config = _config(log_dir, dynamic_sampling=dynamic, save_every=1, **options)
        _train(config, service, dataset)

    whole, split = FakeServiceClient(vocab_size=VOCAB), FakeServiceClient(vocab_size=VOCAB)
    run(tmp_path / "whole", whole)
    run(tmp_path / "split", split, max_steps=2)
    resumed = FakeServiceClient(vocab_size=VOCAB, store=split.store)
    run(tmp_path / "split", resumed)
    assert _trained_prompts(_sent(resumed)[0]) == _trained_prompts(_sent(whole)[2])

    def comparable(log_dir: Path) -> list[dict[str, Any]]:
        # done_frac reads max_steps, which the first part of the split run set
        rows = [_without_times(r) for r in _step_rows(log_dir)]
        return [{k: v for k, v in r.items() if k != "progress/done_frac"} for r in rows]

    assert comparable(tmp_path / "split") == comparable(tmp_path / "whole")


def test_dynamic_sampling_stops_after_its_rounds_and_trains_what_it_found(tmp_path: Path) -> None:
    service = FakeServiceClient(vocab_size=VOCAB)
    dataset = ScriptedDataset(_mixed_where({(0, 1)}), num_batches=3, groups_per_batch=3)
    dynamic = {"groups_per_batch": 2, "max_sampling_rounds": 3}
    _train(_config(tmp_path, dynamic_sampling=dynamic), service, dataset)
    row = _step_rows(tmp_path)[0]
    assert row["dynamic_sampling/rounds"] == 3
    assert row["dynamic_sampling/groups_sampled"] == 3 + 3 + 3
    assert row["dynamic_sampling/groups_kept"] == 1
    assert row["batch/num_trained_groups"] == 1
    assert _trained_prompts(_sent(service)[0]) == [(0, 1)]


def test_dynamic_sampling_without_any_mixed_group_trains_the_first(tmp_path: Path) -> None:
    service = FakeServiceClient(vocab_size=VOCAB)
    dataset = ScriptedDataset(_mixed_where(set()), num_batches=1, groups_per_batch=2)
    dynamic = {"groups_per_batch": 1, "max_sampling_rounds": 2}
    _train(_config(tmp_path, dynamic_sampling=dynamic), service, dataset)
    (row,) = _step_rows(tmp_path)
    assert (row["dynamic_sampling/rounds"], row["dynamic_sampling/groups_kept"]) == (2, 0)
    assert row["dynamic_sampling/groups_sampled"] == 4  # one batch: round 1 rolls it again
    assert row["batch/num_trained_groups"] == 1


def test_dynamic_sampling_larger_than_the_batch_is_refused_before_anything_runs(
    tmp_path: Path,
) -> None:
    dataset = ScriptedDataset(_mixed_where(set()), num_batches=1, groups_per_batch=2)
    config = _config(tmp_path, dynamic_sampling={"groups_per_batch": 3, "max_sampling_rounds": 2})
    with pytest.raises(ConfigError, match=r"dynamic_sampling.groups_per_batch: 3 is larger"):
        _train(config, FakeServiceClient(), dataset)
    assert not (tmp_path / "metrics.jsonl").exists()


# --- config ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mismatch_correction": {"cap": 0.5}}, "mismatch_correction.cap: must be finite and >= 1"),
        ({"mismatch_correction": {"mode": "clip"}}, "mismatch_correction.mode: must be one of"),
        ({"mismatch_correction": {"levels": "token"}}, "unknown field `levels`"),
        ({"overlong": {"max_length": 2, "buffer": 3}}, "overlong.buffer: must be <= overlong"),
        ({"overlong": {"max_length": 0, "buffer": 1}}, "overlong.max_length: must be >= 1"),
        ({"kl_penalty_estimator": "k3"}, "kl_penalty_estimator: only applies with kl_penalty"),
        ({"kl_penalty_estimator": "k4"}, "kl_penalty_estimator: must be one of"),
        (
            {"mismatch_correction": {}, "loss_fn": "stable_reinforce"},
            "mismatch_correction: is not combined with loss_fn 'stable_reinforce'",
        ),
        (
            {
                "mismatch_correction": {},
                "async_config": {"max_steps_off_policy": 1, "groups_per_batch": 1},
            },
            "mismatch_correction: is not combined with loss_fn 'stable_reinforce'",
        ),
        (
            {"dynamic_sampling": {"groups_per_batch": 1, "max_sampling_rounds": 0}},
            "dynamic_sampling.max_sampling_rounds: must be >= 1",
        ),
        (
            {
                "dynamic_sampling": {"groups_per_batch": 1, "max_sampling_rounds": 2},
                "async_config": {
                    "max_steps_off_policy": 0,
                    "groups_per_batch": 1,
                    "loss_fn": "ppo",
                },
            },
            "dynamic_sampling: runs in the sync mode only",
        ),
    ],
)
def test_bad_values_are_refused_naming_the_field(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        _config(tmp_path, **options)
    assert "\n" not in str(error.value)


def test_the_defaults_are_off() -> None:
    config = TrainConfig()
    assert config.mismatch_correction is None and config.overlong is None
    assert config.dynamic_sampling is None and config.kl_penalty_estimator == "k1"


# --- the cookbook-style Config's extensions -----------------------------------------------------


def test_the_cookbook_config_extensions_default_off_and_map_onto_the_train_config(
    tmp_path: Path,
) -> None:
    from shell.config import DynamicSamplingConfig, MismatchCorrectionConfig, OverlongConfig
    from shell.cookbook.rl import train as cookbook_train
    from tests.shell.test_rl_facade import _config as cookbook_config

    plain = cookbook_train.to_train_config(cookbook_config(tmp_path), backend="fake")
    assert plain.mismatch_correction is None and plain.overlong is None
    assert plain.dynamic_sampling is None and plain.kl_penalty_estimator == "k1"
    correction = MismatchCorrectionConfig(level="geometric", mode="truncate", cap=2.0)
    overlong = OverlongConfig(max_length=8, buffer=2)
    dynamic = DynamicSamplingConfig(groups_per_batch=2, max_sampling_rounds=3)
    extended = cookbook_config(
        tmp_path,
        mismatch_correction=correction,
        overlong=overlong,
        dynamic_sampling=dynamic,
        kl_penalty_coef=0.1,
        kl_reference_config=cookbook_train.KLReferenceConfig(base_model="base/m"),
        kl_penalty_estimator="k3",
    )
    mapped = cookbook_train.to_train_config(extended, backend="fake")
    assert (mapped.mismatch_correction, mapped.overlong) == (correction, overlong)
    assert (mapped.dynamic_sampling, mapped.kl_penalty_estimator) == (dynamic, "k3")
    with pytest.raises(ConfigError, match="kl_penalty_estimator: only applies with kl_penalty"):
        cookbook_train.to_train_config(
            cookbook_config(tmp_path, kl_penalty_estimator="k2"), backend="fake"
        )


def test_the_local_backend_agrees_with_its_own_sampler(tmp_path: Path) -> None:
    """On the local backend the trainer's `forward` scores the sampled tokens as its sampler
    did (same weights, temperature 1), to float32 rounding: nothing is masked."""
    from tests.local.micro import MICRO_NAME, micro_service

    correction = {"level": "token", "mode": "mask", "cap": 1.001}
    config = _config(
        tmp_path, backend="local", base_model=MICRO_NAME, mismatch_correction=correction
    )
    dataset = ScriptedDataset(_odd_count_builder, num_batches=1, groups_per_batch=2)
    asyncio.run(train(config, dataset=dataset, service_client=micro_service(tmp_path)))
    (row,) = _step_rows(tmp_path)
    assert row["mismatch/rollout_is_masked_fraction"] == 0.0
    assert row["mismatch/rollout_is_mean"] == pytest.approx(1.0, abs=1e-4)
