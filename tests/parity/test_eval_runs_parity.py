"""Differential tests: the facade's `rl.train.run_evaluations_parallel` against the cookbook's.

The same evaluators (a test-set evaluator over one env module, written against the cookbook and
ported by the import rewrite, and a constant evaluator) run through either package's
`run_evaluations_parallel` with a sampling client whose completions depend on the prompt alone.
Both give the same metrics, write the same files, and the rollout summaries the same records;
the evaluator labels and task names are the cookbook's. Last, the facade's `eval` package has
the cookbook's evaluator names. Needs the cookbook (`make parity`).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import tinker

from shell.fakes import FakeSamplingClient
from tests.parity.porting import ported_source, require_cookbook

COOKBOOK = require_cookbook()

from tinker_cookbook.rl import train as cb_train  # noqa: E402
from tinker_cookbook.stores import TrainingRunStore as CbStore  # noqa: E402
from tinker_cookbook.stores import storage_from_uri as cb_storage_from_uri  # noqa: E402

from shell.cookbook.rl import train  # noqa: E402
from shell.cookbook.stores import TrainingRunStore, storage_from_uri  # noqa: E402

ENV_SOURCE = '''
import tinker
from tinker_cookbook.eval.evaluators import SamplingClientEvaluator
from tinker_cookbook.rl.metric_util import RLTestSetEvaluator
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, StepResult
from tinker_cookbook.utils import logtree


class CountEnv(Env):
    """One step: reward 1 when the action has an even length; logs to logtree."""

    def __init__(self, problem):
        self.problem = problem

    @property
    def stop_condition(self):
        return [0]

    async def initial_observation(self):
        return tinker.ModelInput.from_ints([1, 2, 3 + self.problem]), self.stop_condition

    async def step(self, action, *, extra=None):
        logtree.log_text(f"problem {self.problem} acted {list(action)}")
        hit = len(action) % 2 == 0
        return StepResult(
            reward=1.0 if hit else 0.0,
            episode_done=True,
            next_observation=tinker.ModelInput.empty(),
            next_stop_condition=self.stop_condition,
            metrics={"action_len": float(len(action))},
            logs={"problem": self.problem},
        )


class CountBuilder(EnvGroupBuilder):
    def __init__(self, problem, group_size):
        self.problem = problem
        self.group_size = group_size

    async def make_envs(self):
        return [CountEnv(self.problem) for _ in range(self.group_size)]

    def logging_tags(self):
        return ["even" if self.problem % 2 == 0 else "odd"]


class CountDataset(RLDataset):
    def __init__(self, num_batches, groups_per_batch, group_size):
        self.num_batches = num_batches
        self.groups_per_batch = groups_per_batch
        self.group_size = group_size

    def get_batch(self, index):
        first = index * self.groups_per_batch
        return [
            CountBuilder(first + p, self.group_size) for p in range(self.groups_per_batch)
        ]

    def __len__(self):
        return self.num_batches


class Constant(SamplingClientEvaluator):
    def __init__(self, metrics):
        self.metrics = metrics

    async def __call__(self, sampling_client):
        return dict(self.metrics)
'''


def _module(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


COOKBOOK_ENVS = _module("h28d_cookbook_envs", ENV_SOURCE)
PORTED_ENVS = _module("h28d_ported_envs", ported_source(ENV_SOURCE))


class PromptSampler(FakeSamplingClient):
    """Completions that depend on the prompt alone: `k = last % 4 + 1` copies of the last token."""

    async def _sample(
        self, prompt: tinker.ModelInput, num_samples: int, sampling_params: tinker.SamplingParams
    ) -> tinker.SampleResponse:
        tokens_in = prompt.to_ints()
        self.sample_calls.append((tokens_in, num_samples, sampling_params))
        last = tokens_in[-1]
        length = min(last % 4 + 1, sampling_params.max_tokens or 4)
        tokens = np.full(length, last, np.int32)
        return tinker.SampleResponse(
            sequences=[
                tinker.SampledSequence(
                    stop_reason="stop",
                    sequence_id=f"s{i}",
                    tokens_np=tokens,
                    logprobs_np=np.full(length, -math.log(16), np.float32),
                )
                for i in range(num_samples)
            ]
        )


def _evaluators(envs: types.ModuleType, *, names: tuple[str, str]) -> list[Any]:
    dataset = envs.CountDataset(num_batches=2, groups_per_batch=3, group_size=2)
    return [
        envs.RLTestSetEvaluator(dataset, max_tokens=8, name=names[0]),
        envs.Constant({"const/a": 1.0, f"{names[0]}/env/all/reward/total": -1.0}),
        envs.RLTestSetEvaluator(dataset, max_tokens=8, name=names[1]),
    ]


def _run(package: str, log_path: Path, *, num_groups_to_log: int, export: bool) -> dict[str, Any]:
    module, envs, store_type, from_uri = (
        (cb_train, COOKBOOK_ENVS, CbStore, cb_storage_from_uri)
        if package == "cookbook"
        else (train, PORTED_ENVS, TrainingRunStore, storage_from_uri)
    )
    config = SimpleNamespace(
        log_path=str(log_path), num_groups_to_log=num_groups_to_log, rollout_json_export=export
    )
    evaluators = _evaluators(envs, names=("held out/v1", "test"))
    store = store_type(from_uri(str(log_path)))
    return asyncio.run(
        module.run_evaluations_parallel(evaluators, PromptSampler(), config, 7, store=store)
    )


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize(("num_groups_to_log", "export"), [(4, True), (0, True), (2, False)])
def test_the_same_evaluators_give_the_same_metrics_and_files(
    tmp_path: Path, num_groups_to_log: int, export: bool
) -> None:
    theirs = _run("cookbook", tmp_path / "cb", num_groups_to_log=num_groups_to_log, export=export)
    ours = _run("rlpure", tmp_path / "ours", num_groups_to_log=num_groups_to_log, export=export)
    assert ours == theirs
    assert theirs["const/a"] == 1.0 and theirs["test/env/all/reward/total"] > 0
    # merged in order: the constant evaluator (second) overwrites the first evaluator's key
    assert theirs["held out/v1/env/all/reward/total"] == -1.0
    files = _files(tmp_path / "cb")
    assert _files(tmp_path / "ours") == files
    expected = {
        "iteration_000007/eval_held_out_v1_rollout_summaries.jsonl",
        "iteration_000007/eval_test_rollout_summaries.jsonl",
    }
    assert expected <= set(files) if export else not (expected & set(files))
    for name in files:
        if name.endswith(".jsonl"):
            read = [
                [json.loads(line) for line in (tmp_path / side / name).read_text().splitlines()]
                for side in ("cb", "ours")
            ]
            assert read[1] == read[0], name


def test_the_page_holds_what_the_envs_log(tmp_path: Path) -> None:
    _run("rlpure", tmp_path, num_groups_to_log=4, export=True)
    page = (tmp_path / "iteration_000007" / "eval_test.html").read_text()
    assert "Running evaluation test 7" in page
    assert "problem 0 acted" in page and "problem 5 acted" in page
    tree = json.loads((tmp_path / "iteration_000007" / "eval_1_logtree.json").read_text())
    assert tree  # the constant evaluator's page: the explanation only, labelled by its index


def test_labels_and_task_names_are_the_cookbooks() -> None:
    for text in ("held out/v1", "../x", "", "...", "a.b-c_d"):
        assert train._sanitize_filename_component(text) == cb_train._sanitize_filename_component(
            text
        )
    names: dict[str, list[str]] = {}
    for package, module, envs in (
        ("cookbook", cb_train, COOKBOOK_ENVS),
        ("rlpure", train, PORTED_ENVS),
    ):
        seen: list[str] = []

        async def spy(*args: Any, _seen: list[str] = seen, **kwargs: Any) -> dict[str, Any]:
            task = asyncio.current_task()
            assert task is not None
            _seen.append(task.get_name())
            return {}

        evaluators = _evaluators(envs, names=("x y", "test"))
        config = SimpleNamespace(log_path=None, num_groups_to_log=0, rollout_json_export=False)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(module, "run_single_evaluation", spy)
            asyncio.run(module.run_evaluations_parallel(evaluators, PromptSampler(), config, 3))
        names[package] = seen
    assert (
        names["rlpure"]
        == names["cookbook"]
        == [
            "eval_x_y_iteration_000003",
            "eval_1_iteration_000003",
            "eval_test_iteration_000003",
        ]
    )


def test_the_eval_package_has_the_cookbooks_evaluator_names() -> None:
    import tinker_cookbook.eval as theirs

    import shell.cookbook.eval as ours

    for name in (
        "Evaluator",
        "EvaluatorBuilder",
        "SamplingClientEvaluator",
        "SamplingClientEvaluatorBuilder",
        "TrainingClientEvaluator",
        "BenchmarkResult",
    ):
        assert name in theirs.__all__ and name in ours.__all__, name
    assert [n for n in ours.__all__ if n not in theirs.__all__] == []


@pytest.mark.parametrize("name", ["run_evaluations_parallel", "run_single_evaluation"])
def test_the_entry_points_have_the_cookbooks_signatures(name: str) -> None:
    def params(function: Any) -> list[tuple[str, Any, Any]]:
        return [
            (p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()
        ]

    assert params(getattr(train, name)) == params(getattr(cb_train, name))
    assert inspect.iscoroutinefunction(getattr(train, name))
