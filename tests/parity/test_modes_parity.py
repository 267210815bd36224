"""The throughput modes against tinker-cookbook 0.6.1's `rl.train.main` on the same fake SDK.

One small env module, written against the cookbook's API (`ENV_SOURCE`), is imported twice: as
it is (the cookbook's `main` runs it) and through the port rule (`ported_source`: its
`tinker_cookbook` imports become `shell.cookbook`, and `shell.cookbook.rl.train.main` runs it). Both mains train
on `shell.fakes.FakeServiceClient` (the cookbook's through `tinker.ServiceClient`, patched):
sampling at temperature 0 is deterministic there, so both sides see the same trajectories, and
each env's reward is its index in the group (mixed groups, non-zero advantages). Each group's
env steps sleep so that groups finish in reverse order within a batch.

Compared, per `forward_backward` call (a minibatch when streaming, a step otherwise): the
datums sent (model input and every loss input, as a multiset: both sides order a call's datums
by completion, which the event loop may interleave differently), the loss, and the mode's
metric names in `metrics.jsonl`. Skipped without the cookbook.
"""

from __future__ import annotations

import asyncio
import json
import sys
import types
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest

from tests.parity.porting import ported_source, require_cookbook

require_cookbook()

import tinker  # noqa: E402
import tinker_cookbook.rl.train as cookbook_train  # noqa: E402
from tinker_cookbook import tokenizer_utils  # noqa: E402

from rlpure.model import ByteTokenizer  # noqa: E402
from shell.cookbook.rl import train as our_train  # noqa: E402
from shell.fakes import FakeFuture, FakeSamplingClient, FakeServiceClient, FakeTrainingClient  # noqa: E402

MODEL = "test/modes-parity"

ENV_SOURCE = """
import asyncio

import chz
import tinker

from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult

GROUPS_PER_BATCH = 4
NUM_BATCHES = 3


class IndexEnv(Env):
    def __init__(self, problem, index, latency):
        self.problem, self.index, self.latency = problem, index, latency

    async def initial_observation(self):
        return tinker.ModelInput.from_ints([1, 2, 3 + self.problem]), []

    async def step(self, action, *, extra=None):
        await asyncio.sleep(self.latency)
        return StepResult(
            reward=float(self.index),
            episode_done=True,
            next_observation=tinker.ModelInput.empty(),
            next_stop_condition=[],
            metrics={"index": float(self.index)},
        )


class IndexGroup(EnvGroupBuilder):
    def __init__(self, batch, problem):
        self.batch, self.problem = batch, problem

    async def make_envs(self):
        latency = 0.04 * (GROUPS_PER_BATCH - self.problem)
        return [IndexEnv(self.batch * GROUPS_PER_BATCH + self.problem, i, latency) for i in range(2)]

    def logging_tags(self):
        return ["modes"]


class IndexDataset(RLDataset):
    def get_batch(self, index):
        return [IndexGroup(index, p) for p in range(GROUPS_PER_BATCH)]

    def __len__(self):
        return NUM_BATCHES


@chz.chz
class IndexDatasetBuilder(RLDatasetBuilder):
    async def __call__(self):
        return IndexDataset(), None
"""


def _module(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    sys.modules[name] = module  # chz looks the module up while the class body runs
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


COOKBOOK_ENV = _module("modes_parity_cookbook_env", ENV_SOURCE)
PORTED_ENV = _module("modes_parity_ported_env", ported_source(ENV_SOURCE))


class _TrainingClient(FakeTrainingClient):
    """The fake plus the one SDK call the cookbook's async loop makes that ours does not."""

    def create_sampling_client(
        self, model_path: str, retry_config: Any = None, record_stability_info: bool = False
    ) -> FakeFuture[FakeSamplingClient]:
        version = int(self.store.load(model_path)["optim_steps"])
        client = FakeSamplingClient(
            version=version, vocab_size=self.vocab_size, seed=self.seed, events=self.events
        )
        return FakeFuture(client, events=self.events, label="sampling_client")


class _Service(FakeServiceClient):
    """`FakeServiceClient` as the cookbook opens `tinker.ServiceClient`: keyword options
    accepted, a context manager, and training clients of `_TrainingClient`."""

    made: ClassVar[list[_Service]] = []

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        _Service.made.append(self)

    def _training_client(self, base_model: str, rank: int) -> FakeTrainingClient:
        client = _TrainingClient(
            base_model=base_model, rank=rank, store=self.store, events=self.events
        )
        self.training_clients.append(client)
        return client

    def __enter__(self) -> _Service:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.fixture
def cookbook_on_fakes(monkeypatch: pytest.MonkeyPatch) -> Any:
    tokenizer_utils.register_tokenizer(MODEL, ByteTokenizer)
    monkeypatch.setattr(cookbook_train, "fetch_model_pricing", lambda model_name: None)
    monkeypatch.setattr(tinker, "ServiceClient", _Service)
    _Service.made.clear()
    try:
        yield
    finally:
        tokenizer_utils.unregister_tokenizer(MODEL)


def _sent(service: FakeServiceClient) -> list[tuple[str, Counter[str]]]:
    """Per forward_backward call: the loss and the multiset of datums (JSON of each)."""
    calls = [e for e in service.events if e[0] == "forward_backward"]
    data = [chunk for client in service.training_clients for chunk in client.sent_data]
    assert len(calls) == len(data)
    out = []
    for call, chunk in zip(calls, data, strict=True):
        datums = Counter(
            json.dumps(
                {
                    "model_input": [int(t) for t in d.model_input.to_ints()],
                    **{
                        k: [round(float(x), 5) for x in v.tolist()]
                        for k, v in d.loss_fn_inputs.items()
                    },
                },
                sort_keys=True,
            )
            for d in chunk
        )
        out.append((call[2], datums))
    return out


def _rows(log_path: Path) -> list[dict[str, Any]]:
    lines = (log_path / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _both(tmp_path: Path, **mode: Any) -> tuple[FakeServiceClient, FakeServiceClient, Path, Path]:
    common: dict[str, Any] = {
        "learning_rate": 1e-3,
        "model_name": MODEL,
        "recipe_name": "modes_parity",
        "max_tokens": 4,
        "temperature": 0.0,
        "eval_every": 0,
        "save_every": 0,
    }
    theirs_path, ours_path = tmp_path / "cookbook", tmp_path / "ours"
    cookbook_mode = {k: _cookbook_record(v) for k, v in mode.items()}
    asyncio.run(
        cookbook_train.main(
            cookbook_train.Config(
                dataset_builder=COOKBOOK_ENV.IndexDatasetBuilder(),
                log_path=str(theirs_path),
                **common,
                **cookbook_mode,
            )
        )
    )
    (theirs,) = _Service.made
    ours = FakeServiceClient()
    asyncio.run(
        our_train.main(
            our_train.Config(
                dataset_builder=PORTED_ENV.IndexDatasetBuilder(),
                log_path=str(ours_path),
                **common,
                **mode,
            ),
            service_client=ours,
        )
    )
    return theirs, ours, theirs_path, ours_path


def _cookbook_record(record: Any) -> Any:
    if isinstance(record, int | float | str):
        return record
    if isinstance(record, our_train.StreamMinibatchConfig):
        return cookbook_train.StreamMinibatchConfig(
            groups_per_batch=record.groups_per_batch, num_minibatches=record.num_minibatches
        )
    return cookbook_train.AsyncConfig(
        max_steps_off_policy=record.max_steps_off_policy,
        groups_per_batch=record.groups_per_batch,
        loss_fn=record.loss_fn,
    )


def _keys(rows: list[dict[str, Any]], prefixes: tuple[str, ...]) -> set[str]:
    return {k for row in rows for k in row if k.startswith(prefixes)}


@pytest.mark.parametrize(("num_minibatches", "num_substeps"), [(2, 1), (4, 1), (1, 2), (2, 2)])
def test_streaming_sends_the_cookbooks_minibatches(
    tmp_path: Path, cookbook_on_fakes: None, num_minibatches: int, num_substeps: int
) -> None:
    stream = our_train.StreamMinibatchConfig(groups_per_batch=4, num_minibatches=num_minibatches)
    theirs, ours, theirs_path, ours_path = _both(
        tmp_path, stream_minibatch_config=stream, num_substeps=num_substeps
    )
    assert _sent(ours) == _sent(theirs)
    calls = [e[0] for e in ours.events if e[0] in ("forward_backward", "optim_step")]
    assert calls == [e[0] for e in theirs.events if e[0] in ("forward_backward", "optim_step")]
    prefixes = ("time/train/", "sampling_client/", "time/sampling_time", "progress/", "optim/lr")
    assert _keys(_rows(ours_path), prefixes) == _keys(_rows(theirs_path), prefixes)


@pytest.mark.parametrize("loss_fn", ["stable_reinforce", "ppo"])
def test_on_policy_async_trains_the_cookbooks_steps(
    tmp_path: Path, cookbook_on_fakes: None, loss_fn: Literal["stable_reinforce", "ppo"]
) -> None:
    run_async = our_train.AsyncConfig(max_steps_off_policy=0, groups_per_batch=2, loss_fn=loss_fn)
    theirs, ours, theirs_path, ours_path = _both(tmp_path, async_config=run_async)
    assert _sent(ours) == _sent(theirs)
    assert {loss for loss, _ in _sent(ours)} == {loss_fn}
    prefixes = ("async/", "sampling_client/", "time/sampling_time", "training_client/", "optim/lr")
    assert _keys(_rows(ours_path), prefixes) == _keys(_rows(theirs_path), prefixes)
    for side in (ours_path, theirs_path):
        staleness = [r["async/staleness_max"] for r in _rows(side) if "async/staleness_max" in r]
        assert staleness == [0] * 3  # max_steps_off_policy = 0: every group on-policy


def test_off_policy_async_trains_every_group_once_as_the_cookbook(
    tmp_path: Path, cookbook_on_fakes: None
) -> None:
    # groups_per_batch = the batch size: the run's 3 steps train all 12 groups, whichever
    # sampler each came from (which groups a step takes depends on completion order)
    run_async = our_train.AsyncConfig(max_steps_off_policy=2, groups_per_batch=4)
    theirs, ours, theirs_path, ours_path = _both(tmp_path, async_config=run_async)
    everything: list[Counter[Any]] = [Counter(), Counter()]
    for total, side in zip(everything, (ours, theirs), strict=True):
        for _, datums in _sent(side):
            total.update(datums)
    assert everything[0] == everything[1] and sum(everything[0].values()) == 3 * 4 * 2
    prefixes = ("async/", "sampling_client/", "training_client/")
    assert _keys(_rows(ours_path), prefixes) == _keys(_rows(theirs_path), prefixes)
