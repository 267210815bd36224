"""`shell.cookbook.rl`: the cookbook's module names over our own objects, and `shell.cookbook.rl.train.main`.

A cookbook-style env written here with the facade's imports only (`shell.cookbook.rl.types`,
`shell.cookbook.renderers`, `shell.cookbook.tokenizer_utils.get_tokenizer`, `tinker.ModelInput` observations,
bool metrics, a `@chz.chz` dataset builder with required fields) trains two steps through
`main(config, service_client=LocalServiceClient(...))` on a micro local model (the tiny model's
architecture, shrunk so it compiles in seconds), then resumes. No
cookbook needed; `tests/parity/test_port_envs.py` does the same with the cookbook's own envs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import chz
import numpy as np
import pytest
import tinker

from rlpure.records import ModelInput, TokensWithLogprobs
from shell.cookbook import renderers
from shell.cookbook.rl import data_processing, problem_env, rollout_strategy, rollouts, train
from shell.cookbook.rl.types import (
    Action,
    ActionExtra,
    Env,
    EnvGroupBuilder,
    RLDataset,
    RLDatasetBuilder,
    StepResult,
    Trajectory,
    TrajectoryGroup,
    Transition,
)
from shell.cookbook.tokenizer_utils import get_tokenizer
from shell.errors import ConfigError
from shell.fakes import FakeServiceClient
from tests.local.micro import MICRO_NAME, micro_service

MODEL = MICRO_NAME  # the tiny local model's architecture, shrunk so the test compiles in seconds


# --- a cookbook-style env, written against the facade -----------------------------------------


class SayAEnv(Env):
    """Single turn: reward 1 when the reply contains an 'a'."""

    def __init__(self, renderer: renderers.Renderer) -> None:
        self.renderer = renderer

    async def initial_observation(self):
        convo: list[renderers.Message] = [{"role": "user", "content": "Say a"}]
        return self.renderer.build_generation_prompt(convo), self.renderer.get_stop_sequences()

    async def step(self, action: Action, *, extra: ActionExtra | None = None) -> StepResult:
        message, _termination = self.renderer.parse_response(action)
        text = renderers.get_text_content(message)
        return StepResult(
            reward=float("a" in text),
            episode_done=True,
            next_observation=tinker.ModelInput.empty(),
            next_stop_condition=self.renderer.get_stop_sequences(),
            metrics={"has_a": "a" in text},  # a bool metric, as cookbook envs report
        )


@dataclass(frozen=True)
class SayAGroupBuilder(EnvGroupBuilder):
    renderer: renderers.Renderer
    num_envs: int

    async def make_envs(self) -> Sequence[Env]:
        return [SayAEnv(self.renderer) for _ in range(self.num_envs)]

    def logging_tags(self) -> list[str]:
        return ["say_a"]


@dataclass(frozen=True)
class SayADataset(RLDataset):
    renderer: renderers.Renderer
    batch_size: int
    group_size: int
    n_batches: int

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return [SayAGroupBuilder(self.renderer, self.group_size) for _ in range(self.batch_size)]

    def __len__(self) -> int:
        return self.n_batches


@chz.chz
class SayADatasetBuilder(RLDatasetBuilder):
    batch_size: int
    model_name: str
    renderer_name: str
    group_size: int
    n_batches: int = 4

    async def __call__(self) -> tuple[RLDataset, None]:
        renderer = renderers.get_renderer(self.renderer_name, get_tokenizer(self.model_name))
        return SayADataset(renderer, self.batch_size, self.group_size, self.n_batches), None


def _config(log_path: Path, **overrides) -> train.Config:
    options: dict[str, Any] = {
        "learning_rate": 1e-3,
        "dataset_builder": SayADatasetBuilder(
            batch_size=2, model_name=MODEL, renderer_name="role_colon", group_size=2
        ),
        "model_name": MODEL,
        "recipe_name": "facade_test",
        "max_tokens": 4,
        "log_path": str(log_path),
        "renderer_name": "role_colon",
        "max_steps": 2,
        "eval_every": 0,
    }
    options.update(overrides)
    return train.Config(**options)


def _metrics(log_path: Path) -> list[dict]:
    lines = (log_path / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_a_cookbook_style_env_trains_two_steps_through_main_then_resumes(tmp_path) -> None:
    log_path = tmp_path / "run"
    service = micro_service(log_path / "local_states")
    result = asyncio.run(train.main(_config(log_path), service_client=service))
    assert (result.start_step, result.end_step) == (0, 2)
    steps = [m for m in _metrics(log_path) if _is_step(m)]
    assert [m["step"] for m in steps] == [0, 1]
    assert all("env/all/reward/total" in m and "env/all/has_a" in m for m in steps)
    assert [m["step"] for m in _metrics(log_path) if "final_totals" in m] == [2]

    resumed = asyncio.run(train.main(_config(log_path, max_steps=3), service_client=service))
    assert (resumed.start_step, resumed.end_step) == (2, 3)
    assert [m["step"] for m in _metrics(log_path) if _is_step(m)] == [0, 1, 2]
    # the old run's totals row (step 2) was dropped with the rows after its checkpoint
    assert [m["step"] for m in _metrics(log_path) if "final_totals" in m] == [3]
    assert "final_totals" in _metrics(log_path)[-1]


def _trace_spans(path: Path) -> list[tuple[str, str, int, int]]:
    """The begin and end events of a JSONL trace: `(phase, name, pid, tid)` in file order."""
    events = [json.loads(line) for line in path.read_text().splitlines()]
    return [(e["ph"], e["name"], e["pid"], e["tid"]) for e in events if e["ph"] in "BE"]


def _balanced(spans: list[tuple[str, str, int, int]]) -> bool:
    """Every track's begin and end events nest (a stack per `(pid, tid)`), none left open."""
    stacks: dict[tuple[int, int], list[str]] = {}
    for phase, name, pid, tid in spans:
        stack = stacks.setdefault((pid, tid), [])
        if phase == "B":
            stack.append(name)
        elif not stack or stack.pop() != name:
            return False
    return not any(stacks.values())


def test_enable_trace_and_span_chart_every_write_the_cookbooks_files_and_a_resume_appends(
    tmp_path,
) -> None:
    log_path = tmp_path / "run"
    service = micro_service(log_path / "local_states")
    config = _config(log_path, max_steps=3, enable_trace=True, span_chart_every=2)
    asyncio.run(train.main(config, service_client=service))
    trace = log_path / "trace_events.jsonl"
    spans = _trace_spans(trace)
    assert _balanced(spans)
    begun = [name for phase, name, _, _ in spans if phase == "B"]
    # the loop's spans, named as the cookbook's, once per step where it times them
    for name in ("sampling", "do_train_step_and_get_sampling_client", "train_step"):
        assert begun.count(name) == 3, name
    assert begun.count("env_step") == 3 * 2 * 2  # steps × groups × envs, one turn each
    rows = [json.loads(line) for line in (log_path / "timing_spans.jsonl").read_text().splitlines()]
    timed = [span["name"] for row in rows for span in row["spans"]]
    assert sorted(begun) == sorted(timed)  # the trace holds exactly the spans the steps timed
    charts = sorted(p.parent.name for p in log_path.glob("iteration_*/timing_gantt.html"))
    assert charts == ["iteration_000000", "iteration_000002"]
    page = (log_path / "iteration_000002" / "timing_gantt.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "data:image/png;base64," in page

    resumed = _config(log_path, max_steps=4, enable_trace=True, span_chart_every=2)
    asyncio.run(train.main(resumed, service_client=service))
    again = _trace_spans(trace)
    assert again[: len(spans)] == spans and _balanced(again)
    assert [name for phase, name, _, _ in again if phase == "B"].count("train_step") == 4


def test_rollout_json_export_false_writes_the_pages_without_the_rollout_summaries(
    tmp_path,
) -> None:
    log_path = tmp_path / "run"
    config = _config(log_path, max_steps=1, rollout_json_export=False)
    asyncio.run(train.main(config, service_client=micro_service(log_path / "s")))
    written = {p.name for p in (log_path / "iteration_000000").iterdir()}
    assert written == {"train.html", "train_logtree.json"}
    assert (log_path / "samples.jsonl").exists()
    quiet = tmp_path / "quiet"
    config = _config(quiet, max_steps=1, rollout_json_export=False, num_groups_to_log=0)
    asyncio.run(train.main(config, service_client=micro_service(quiet / "s")))
    assert not list(quiet.glob("iteration_*"))  # nothing to write there: no folder either


def test_without_enable_trace_nothing_is_traced_or_charted(tmp_path) -> None:
    log_path = tmp_path / "run"
    asyncio.run(
        train.main(_config(log_path, max_steps=1), service_client=micro_service(log_path / "s"))
    )
    assert not (log_path / "trace_events.jsonl").exists()
    assert not list(log_path.glob("iteration_*/timing_gantt.html"))
    assert (log_path / "timing_spans.jsonl").exists()


def _is_step(row: dict) -> bool:
    """A step's row: not the final evaluation's nor the final totals row (the cookbook's
    `cumulative_metrics()` row after the last step)."""
    return "final_eval" not in row and "final_totals" not in row


# --- main refuses what it cannot honour, before anything runs ------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {
                "async_config": train.AsyncConfig(max_steps_off_policy=0, groups_per_batch=1),
                "loss_fn": "ppo",
            },
            "loss_fn: 'ppo' conflicts with async_config.loss_fn 'stable_reinforce'",
        ),
        (
            {
                "async_config": train.AsyncConfig(max_steps_off_policy=1, groups_per_batch=1),
                "kl_penalty_coef": 0.1,
                "kl_discount_factor": 0.5,
                "kl_reference_config": train.KLReferenceConfig(base_model="m"),
            },
            "kl_discount: 0.5 > 0 is not supported with loss_fn 'stable_reinforce'",
        ),
        (
            {
                "stream_minibatch_config": train.StreamMinibatchConfig(
                    groups_per_batch=3, num_minibatches=2
                )
            },
            "2 minibatches do not divide the 3 groups",
        ),
        ({"kl_penalty_coef": 0.1}, "kl_reference_config must be specified"),
        ({"rollout_error_tolerance": 3}, "Invalid rollout_error_tolerance"),
        ({"base_url": "http://x"}, "Config.base_url"),
        ({"loss_fn": "custom"}, "custom"),
    ],
)
def test_main_refuses_unsupported_or_bad_config_before_anything_runs(
    tmp_path, overrides, message
) -> None:
    log_path = tmp_path / "run"
    with pytest.raises(ConfigError, match=message):
        asyncio.run(train.main(_config(log_path, **overrides), service_client=FakeServiceClient()))
    assert not log_path.exists()


def test_main_refuses_a_fork_process_pool_before_anything_runs(tmp_path) -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"))
    with pool, pytest.raises(ValueError, match="fork"):
        asyncio.run(train.main(_config(tmp_path / "run"), pool, service_client=FakeServiceClient()))
    assert not (tmp_path / "run").exists()


def test_main_runs_group_rollouts_in_a_given_executor_and_shuts_it_down(tmp_path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    class CountingPool(ThreadPoolExecutor):
        submitted = 0

        def submit(self, fn, /, *args, **kwargs):
            CountingPool.submitted += 1
            return super().submit(fn, *args, **kwargs)

    log_path = tmp_path / "run"
    pool = CountingPool(2)
    result = asyncio.run(
        train.main(
            _config(log_path, max_steps=1), pool, service_client=micro_service(log_path / "states")
        )
    )
    assert result.end_step == 1
    assert CountingPool.submitted >= 2  # one step's two groups ran in the pool
    with pytest.raises(RuntimeError, match="shutdown"):
        pool.submit(print)


def test_config_has_the_cookbook_required_fields_and_defaults() -> None:
    with pytest.raises(Exception, match="recipe_name"):
        train.Config(  # type: ignore[call-arg]  # the missing field is the point
            learning_rate=1e-3,
            dataset_builder=SayADatasetBuilder(
                batch_size=1, model_name=MODEL, renderer_name="role_colon", group_size=1
            ),
            model_name=MODEL,
            max_tokens=4,
            log_path="x",
        )
    config = _config(Path("~/run"))
    assert config.log_path == str(Path("~/run").expanduser())
    assert (config.eval_every, config.save_every, config.num_groups_to_log) == (0, 20, 4)
    assert config.loss_fn == "importance_sampling" and config.lora_rank == 32


def test_rollout_error_tolerance_maps_to_strategies_and_train_config(tmp_path) -> None:
    assert _config(tmp_path).effective_rollout_strategy() == rollout_strategy.FailFast()
    retry = _config(tmp_path, rollout_error_tolerance=True)
    assert retry.effective_rollout_strategy() == rollout_strategy.RetryOnFailure()
    viable = rollout_strategy.MinViableGroup(min_successful=1, max_retries=2)
    config = _config(tmp_path, rollout_error_tolerance=viable, kl_discount_factor=0.5)
    assert config.effective_rollout_strategy() is viable  # handed to train() as it is
    mapped = train.to_train_config(config, backend="local")
    assert (mapped.log_dir, mapped.base_model, mapped.kl_discount) == (str(tmp_path), MODEL, 0.5)
    assert (mapped.eval_temperature, mapped.num_epochs, mapped.max_steps) == (1.0, 1, 2)
    inkling = _config(tmp_path, model_name="thinkingmachines/Inkling-1")
    assert isinstance(inkling.effective_rollout_strategy(), rollout_strategy.MinViableGroup)


# --- the other facade modules are our objects ---------------------------------------------


def test_facade_modules_re_export_our_objects() -> None:
    import shell.env
    import shell.rollouts

    assert problem_env.ProblemEnv is shell.env.ProblemEnv
    assert rollouts.do_single_rollout is shell.rollouts.do_single_rollout
    assert rollout_strategy.RetryOnFailure is shell.rollouts.RetryOnFailure


def _group(rewards: Sequence[float]) -> TrajectoryGroup:
    def trajectory(reward: float) -> Trajectory:
        step = Transition(
            ob=ModelInput.from_ints([1, 2]),
            ac=TokensWithLogprobs(tokens=[3, 4], logprobs=[-0.5, -0.25]),
            reward=reward,
            episode_done=True,
        )
        return Trajectory(transitions=(step,), final_ob=ModelInput.empty())

    return TrajectoryGroup(
        trajectories_G=tuple(trajectory(r) for r in rewards),
        final_rewards_G=(0.0,) * len(rewards),
        metrics_G=({},) * len(rewards),
    )


def test_data_processing_has_the_cookbook_signatures_with_numpy_advantages() -> None:
    groups = [_group([1.0, 0.0]), _group([1.0, 1.0])]
    advantages = data_processing.compute_advantages(groups)
    assert [a.tolist() for a in advantages] == [[0.5, -0.5], [0.0, 0.0]]
    assert all(isinstance(a, np.ndarray) and a.dtype == np.float32 for a in advantages)
    data, metadata = data_processing.assemble_training_data(groups, advantages)
    assert metadata == [{"group_idx": p, "traj_idx": g} for p in (0, 1) for g in (0, 1)]
    assert data[0].model_input.to_ints() == [1, 2, 3]
    assert data[0].loss_fn_inputs["mask"].tolist() == [0.0, 1.0, 1.0]
    assert data[0].loss_fn_inputs["advantages"].tolist() == [0.0, 0.5, 0.5]
    assert data_processing.remove_constant_reward_groups(groups) == [groups[0]]
    assert data_processing.remove_constant_reward_groups(groups[1:]) == [groups[1]]


def test_the_termination_policy_reaches_the_train_config_and_the_model_preset_resolves() -> None:
    from shell.rollouts import TerminationRewardPolicy, default_rollout_config_for_model

    policy = TerminationRewardPolicy(zero_reward_on_limit=True, skip_grading_on_timeout=False)
    explicit = train.to_train_config(_config(Path("run"), termination=policy), backend="fake")
    assert explicit.termination is not None
    assert explicit.effective_termination() == policy
    preset = train.to_train_config(
        _config(Path("run"), model_name="thinkingmachines/Inkling-1"), backend="fake"
    )
    agentic = default_rollout_config_for_model("thinkingmachines/Inkling-1").termination
    assert agentic is not None and preset.termination is None
    assert preset.effective_termination() == agentic


def test_wandb_fields_map_onto_the_train_config() -> None:
    mapped = train.to_train_config(
        _config(Path("run"), wandb_project="p", wandb_name="n"), backend="fake"
    )
    assert (mapped.wandb_project, mapped.wandb_name) == ("p", "n")
    # without a project the cookbook's wandb_name only names the Tinker session
    alone = train.to_train_config(_config(Path("run"), wandb_name="n"), backend="fake")
    assert (alone.wandb_project, alone.wandb_name) == (None, None)
