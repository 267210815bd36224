"""The sync loop's parts against tinker-cookbook 0.6.1's `rl/train.py` and friends.

Each test runs the cookbook's own function and ours on the same input: the substep split
(`split_list`), what `train_step` sends, the provenance check (`_check_provenance`), the run's
length (`_resolve_end_batch`) and epoch indexing (`EpochCycledRLDataset`), the data a step
trains on when groups have constant reward (`remove_constant_reward_groups` +
`prepare_minibatch`), the evaluation's sampling options (`RLTestSetEvaluator`), the post-update
KL (`compute_post_kl`) and how evaluator metrics merge (`run_evaluations_parallel`).

Not run here: the cookbook's checks inside `main` (KL reference required when
`kl_penalty_coef > 0`, `stable_reinforce` with `kl_discount_factor > 0`) run only after it
opens a Tinker session; `shell.cookbook.rl.train.main` pins their messages (tests/shell/test_rl_facade.py)
and `TrainConfig` raises them at construction (tests/shell/test_loop_features.py).
Skipped without the cookbook.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import numpy as np
import pytest
import tinker

from rlpure.advantages import compute_advantages
from rlpure.model import ByteTokenizer
from rlpure.packing import assemble_batch
from rlpure.records import ModelInput, TokensWithLogprobs, Trajectory, TrajectoryGroup, Transition
from shell.config import build_config
from shell.cookbook.eval import SamplingClientEvaluator
from shell.datums import to_tinker_datums
from shell.env import EnvGroupBuilder, RLDataset
from shell.errors import ConfigError
from shell.fakes import (
    FakeCheckpointStore,
    FakeSamplingClient,
    FakeServiceClient,
    FakeTrainingClient,
    ScriptedDataset,
    ScriptedEnv,
    ScriptedGroupBuilder,
)
from shell.rollouts import FailFast
from shell.to_cookbook import to_cookbook_groups
from shell.training import evaluate, read_jsonl, resolve_num_steps, train
from shell.training._policy_update import (
    check_provenance,
    post_update_kl_metrics,
    split_into_substeps,
    train_on_groups,
    train_step,
)
from tests.parity.porting import require_cookbook


def _cookbook_train() -> Any:
    require_cookbook()
    from tinker_cookbook.rl import train as cookbook_train

    return cookbook_train


def _traj(tokens: list[int], reward: float, *, sequence_id: str | None = None) -> Trajectory:
    ac = TokensWithLogprobs(
        tokens=np.asarray(tokens),
        logprobs=np.asarray([-0.1 * (t % 5) - 0.2 for t in tokens], np.float32),
        sequence_id=sequence_id,
    )
    step = Transition(ob=ModelInput.from_ints([1, 7, 2]), ac=ac, reward=reward, episode_done=True)
    return Trajectory(transitions=(step,))


def _group(
    rewards: Sequence[float], *, first_token: int = 10, ids: bool = False
) -> TrajectoryGroup:
    trajectories = tuple(
        _traj(
            [first_token + i, 30 + i, 40][: 1 + i % 3],
            reward,
            sequence_id=f"s{first_token}-{i}" if ids else None,
        )
        for i, reward in enumerate(rewards)
    )
    return TrajectoryGroup(
        trajectories_G=trajectories,
        final_rewards_G=(0.0,) * len(rewards),
        metrics_G=({},) * len(rewards),
    )


def _datums(groups: Sequence[TrajectoryGroup], *, include_mask: bool) -> list[tinker.Datum]:
    return to_tinker_datums(
        assemble_batch(groups, compute_advantages(groups)), include_mask=include_mask
    )


# --- substeps ----------------------------------------------------------------------------------


def test_the_substep_split_is_the_cookbooks_split_list() -> None:
    require_cookbook()
    from tinker_cookbook.utils.misc_utils import split_list

    for n in range(1, 90):
        items = list(range(n))
        for num_substeps in range(1, n + 3):
            assert split_into_substeps(items, num_substeps) == split_list(
                items, min(num_substeps, n)
            ), (n, num_substeps)
    assert [len(c) for c in split_into_substeps(list(range(5)), 2)] == [2, 3]


def test_train_step_sends_what_the_cookbooks_train_step_sends() -> None:
    cookbook = _cookbook_train()
    groups = [_group([1.0, 0.0, 1.0]), _group([0.0, 1.0], first_token=20)]
    for num_substeps in (1, 2, 3, 8):
        sides = {}
        for side in ("cookbook", "ours"):
            events: list[tuple[Any, ...]] = []
            client = FakeTrainingClient(
                base_model="m", rank=4, store=FakeCheckpointStore(), events=events
            )
            if side == "cookbook":
                asyncio.run(
                    cookbook.train_step(
                        _datums(groups, include_mask=True), client, 1e-3, num_substeps, "ppo"
                    )
                )
            else:
                adam = tinker.AdamParams(learning_rate=1e-3, beta1=0.9, beta2=0.95, eps=1e-8)
                asyncio.run(
                    train_step(
                        client,
                        _datums(groups, include_mask=False),
                        adam_params=adam,
                        loss_fn="ppo",
                        num_substeps=num_substeps,
                    )
                )
            calls = [e for e in events if e[0] in ("forward_backward", "optim_step")]
            sent = [
                (d.model_input.to_ints(), {k: v.tolist() for k, v in d.loss_fn_inputs.items()})
                for chunk in client.sent_data
                for d in chunk
            ]
            sides[side] = (calls, [len(chunk) for chunk in client.sent_data], sent)
        assert sides["ours"] == sides["cookbook"], num_substeps


def test_the_provenance_check_refuses_what_the_cookbook_refuses() -> None:
    cookbook = _cookbook_train()
    with_ids = _datums([_group([1.0, 0.0], ids=True)], include_mask=False)
    without = _datums([_group([1.0, 0.0])], include_mask=False)
    assert all(d.loss_fn_input_spans is not None for d in with_ids)
    for datums in (with_ids, without, with_ids + without):
        for loss in ("stable_reinforce", "importance_sampling", "ppo"):
            outcomes: list[type[Exception] | None] = []
            for check in (cookbook._check_provenance, check_provenance):
                try:
                    check(datums, loss)
                    outcomes.append(None)
                except ValueError as err:
                    outcomes.append(type(err))
            assert outcomes[0] == outcomes[1], (loss, len(datums))


# --- the run's length and epochs ---------------------------------------------------------------


def test_the_number_of_steps_is_the_cookbooks_resolve_end_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cookbook = _cookbook_train()
    for num_batches in range(6):
        for num_epochs in (1, 2, 3):
            for max_steps in (None, *range(14)):
                caplog.clear()
                with caplog.at_level(logging.WARNING):
                    theirs = cookbook._resolve_end_batch(max_steps, num_batches, num_epochs)
                    warned = bool(caplog.records)
                    total = num_batches * num_epochs
                    assert warned == (max_steps is not None and max_steps > total)
                    caplog.clear()
                    assert resolve_num_steps(max_steps, num_batches, num_epochs) == theirs
                    assert bool(caplog.records) == warned
    require_cookbook()
    from tinker_cookbook.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError, match="num_epochs must be >= 1"):
        cookbook._resolve_end_batch(None, 3, 0)
    with pytest.raises(ConfigError, match="num_epochs: must be >= 1"):
        resolve_num_steps(None, 3, 0)


class _Recording(RLDataset):
    def __init__(self, inner: RLDataset) -> None:
        self.inner = inner
        self.seen: list[int] = []

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        self.seen.append(index)
        return self.inner.get_batch(index)

    def __len__(self) -> int:
        return len(self.inner)


def _scripted(num_batches: int, groups: int = 2) -> ScriptedDataset:
    return ScriptedDataset(
        lambda b, p: ScriptedGroupBuilder(
            lambda i: ScriptedEnv(rewards=[float(i % 2)]), group_size=2
        ),
        num_batches=num_batches,
        groups_per_batch=groups,
    )


def test_epochs_visit_the_batches_the_cookbooks_epoch_cycled_dataset_visits(
    tmp_path: Path,
) -> None:
    cookbook = _cookbook_train()
    from tinker_cookbook.rl.dataset_utils import EpochCycledRLDataset

    for num_epochs, max_steps in ((1, None), (3, None), (3, 5), (2, 1)):
        theirs = _Recording(_scripted(2))
        cycled = EpochCycledRLDataset(theirs, num_epochs)
        for i in range(cookbook._resolve_end_batch(max_steps, 2, num_epochs)):
            cycled.get_batch(i)
        ours = _Recording(_scripted(2))
        config = build_config(
            {"log_dir": str(tmp_path / f"{num_epochs}-{max_steps}"), "backend": "fake"},
            {"progress": False, "max_tokens": 2, "num_epochs": num_epochs, "max_steps": max_steps},
        )
        asyncio.run(train(config, dataset=ours, service_client=FakeServiceClient()))
        assert ours.seen == theirs.seen, (num_epochs, max_steps)


# --- what a step trains on ---------------------------------------------------------------------


class _Tags:
    def logging_tags(self) -> list[str]:
        return []


@pytest.mark.parametrize(
    "rewards_P",
    [
        [[1.0, 1.0, 1.0], [0.0, 0.0], [1.0, 1.0]],  # every group constant: the first is kept
        [[1.0, 1.0], [0.0, 1.0, 1.0], [0.5, 0.5]],  # one mixed group
        [[0.0, 1.0], [1.0, 0.0, 0.0]],  # nothing constant
    ],
)
@pytest.mark.parametrize("remove_constant", [True, False])
def test_a_step_trains_on_the_datums_of_the_cookbooks_sync_step(
    rewards_P: list[list[float]], remove_constant: bool
) -> None:
    cookbook = _cookbook_train()
    from tinker_cookbook.rl.data_processing import remove_constant_reward_groups

    groups = [_group(r, first_token=10 + 10 * p) for p, r in enumerate(rewards_P)]
    cb_groups = to_cookbook_groups(groups)
    if remove_constant:  # as do_sync_training, before do_train_step_and_get_sampling_client
        cb_groups = remove_constant_reward_groups(cb_groups)
    cb_data, _, _ = asyncio.run(
        cookbook.prepare_minibatch(
            [_Tags() for _ in cb_groups], cb_groups, ByteTokenizer(), None, 0.0, 0.0
        )
    )
    service = FakeServiceClient()

    async def ours() -> list[tinker.Datum]:
        client = await service.create_lora_training_client("m")
        config = build_config(
            {"log_dir": "unused", "backend": "fake", "max_tokens": 4},
            {"remove_constant_reward_groups": remove_constant},
        )
        await train_on_groups(
            groups,
            training_client=client,
            kl_reference_client=None,
            config=config,
            adam_params=tinker.AdamParams(learning_rate=1e-3),
        )
        return [d for chunk in client.sent_data for d in chunk]

    sent = asyncio.run(ours())
    assert len(sent) == len(cb_data)
    for mine, theirs in zip(sent, cb_data, strict=True):
        assert mine.model_input.to_ints() == theirs.model_input.to_ints()
        for key in ("target_tokens", "logprobs", "advantages"):
            np.testing.assert_allclose(
                mine.loss_fn_inputs[key].to_numpy(),
                theirs.loss_fn_inputs[key].to_numpy(),
                rtol=1e-6,
                err_msg=key,
            )


# --- evaluation --------------------------------------------------------------------------------


def test_evaluation_samples_with_the_cookbooks_rl_test_set_evaluator_options() -> None:
    require_cookbook()
    from tinker_cookbook.rl.metric_util import RLTestSetEvaluator as CookbookEvaluator

    seen: list[Any] = []

    class Capturing(CookbookEvaluator):  # type: ignore[misc]
        async def eval_token_completer(self, policy: Any, **_: Any) -> dict[str, float]:
            seen.append(policy)
            return {}

    asyncio.run(Capturing(_scripted(1), max_tokens=3)(FakeSamplingClient()))
    (policy,) = seen
    sampler = FakeSamplingClient()
    config = build_config({"log_dir": "unused", "backend": "fake", "max_tokens": 3})
    asyncio.run(evaluate(_scripted(1), sampler, config=config, strategy=FailFast()))
    assert {(p.temperature, p.max_tokens) for _, _, p in sampler.sample_calls} == {
        (policy.temperature, policy.max_tokens)
    }
    assert policy.temperature == 1.0


class _Constant(SamplingClientEvaluator):
    def __init__(self, metrics: dict[str, float]) -> None:
        self.metrics = metrics

    async def __call__(self, sampling_client: Any) -> dict[str, float]:
        return dict(self.metrics)


def _builder(metrics: dict[str, float]) -> Callable[[], _Constant]:
    return lambda: _Constant(metrics)


def test_evaluator_metrics_merge_as_the_cookbooks_run_evaluations_parallel(
    tmp_path: Path,
) -> None:
    cookbook = _cookbook_train()
    specs = [{"eval/a": 1.0, "eval/shared": 1.0}, {"eval/b": 2.0, "eval/shared": 2.0}]
    settings = SimpleNamespace(log_path=None, num_groups_to_log=0, rollout_json_export=False)
    theirs = asyncio.run(
        cookbook.run_evaluations_parallel(
            [_Constant(m) for m in specs], FakeSamplingClient(), settings, 0
        )
    )
    config = build_config(
        {"log_dir": str(tmp_path), "backend": "fake", "progress": False, "max_tokens": 2},
        {"eval_every": 1, "max_steps": 1},
    )
    asyncio.run(
        train(
            config,
            dataset=_scripted(1),
            service_client=FakeServiceClient(),
            evaluator_builders=[_builder(m) for m in specs],
        )
    )
    *evaluated, totals = read_jsonl(tmp_path / "metrics.jsonl")  # step 0, final eval, totals
    assert len(evaluated) == 2 and "final_totals" in totals
    for line in evaluated:
        assert {k: line[k] for k in theirs} == theirs


# --- post-update KL ----------------------------------------------------------------------------


class _ScoringSampler:
    """A sampler whose logprob of prompt token `t` (after the first) is `-0.05 * (t % 9) - 0.1`,
    answering both `compute_logprobs` (ours) and `sample(include_prompt_logprobs=True)`
    (the cookbook's `score_sequences`)."""

    @staticmethod
    def _logprobs(prompt: tinker.ModelInput) -> list[float | None]:
        return [None, *(-0.05 * (t % 9) - 0.1 for t in prompt.to_ints()[1:])]

    def compute_logprobs(self, prompt: tinker.ModelInput, **_: Any) -> Any:
        async def result() -> list[float | None]:
            return self._logprobs(prompt)

        return asyncio.ensure_future(result())

    def sample(self, prompt: tinker.ModelInput, num_samples: int, sampling_params: Any,
               include_prompt_logprobs: bool = False, **_: Any) -> Any:  # fmt: skip
        response = tinker.SampleResponse(sequences=[], _prompt_logprobs_list=self._logprobs(prompt))

        async def result() -> tinker.SampleResponse:
            return response

        return SimpleNamespace(coroutine=result)


def test_post_update_kl_is_the_cookbooks_compute_post_kl() -> None:
    require_cookbook()
    from tinker_cookbook.rl.metrics import compute_post_kl

    groups = [_group([1.0, 0.0, 1.0]), _group([0.0, 1.0], first_token=23)]
    batch = assemble_batch(groups, compute_advantages(groups))

    async def both() -> tuple[dict[str, float], dict[str, float]]:
        theirs, _ = await compute_post_kl(to_tinker_datums(batch), _ScoringSampler())
        mine = await post_update_kl_metrics(_ScoringSampler(), batch)  # type: ignore[arg-type]
        return mine, theirs

    mine, theirs = asyncio.run(both())
    assert set(mine) == set(theirs) == {"kl_pre_post_v1", "kl_pre_post_v2"}
    for key in theirs:
        assert mine[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-7), key
    assert msgspec.json.encode(mine)  # plain floats, JSON-able


# --- termination -------------------------------------------------------------------------------


def test_a_cookbook_termination_policy_maps_onto_the_termination_config() -> None:
    require_cookbook()
    from tinker_cookbook.rl.rollout_limits import TerminationRewardPolicy as CookbookPolicy
    from tinker_cookbook.rl.rollout_presets import agentic as cookbook_agentic
    from tinker_cookbook.rl.rollout_presets import (
        default_rollout_config_for_model as cookbook_default,
    )

    from shell.config import TerminationConfig

    fields = ("zero_reward_on_limit", "limit_stop_reasons", "skip_grading_on_timeout",
              "grader_timeout_seconds", "pass_all_messages_to_grader")  # fmt: skip
    for theirs in (CookbookPolicy(), cookbook_agentic().termination,
                   CookbookPolicy(zero_reward_on_limit=True, grader_timeout_seconds=3.0)):  # fmt: skip
        mine = TerminationConfig.from_policy(theirs).policy()
        assert [getattr(mine, f) for f in fields] == [getattr(theirs, f) for f in fields]
    for model in ("Qwen/Qwen3.5-9B-Base", "thinkingmachines/Inkling-1:peft:262144", "rlpure/tiny"):
        config = build_config({"log_dir": "unused", "backend": "fake", "base_model": model})
        mine_or_none = config.effective_termination()
        theirs_or_none = cookbook_default(model).termination
        assert (mine_or_none is None) == (theirs_or_none is None), model
        if theirs_or_none is not None:
            assert [getattr(mine_or_none, f) for f in fields] == [
                getattr(theirs_or_none, f) for f in fields
            ]
