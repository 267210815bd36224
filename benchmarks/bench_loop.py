"""Loop throughput of the training modes at injected latencies, against the latency floor.

A step of RL on Tinker is two long waits, sampling (plus env work) and training. This script
puts them on the fake SDK (`shell.fakes`) as latencies and measures steps/s of each mode:

- sampling: the slowest group of a batch takes `--sampling` seconds; the others are spread
  evenly below it (group `p` of `G` takes `(p + 1) / G` of it), plus `--env` seconds per env
  step for every group;
- training: a step's datums cost `--train` seconds on one serial trainer (each
  `forward_backward` call holds it for its share of the step's datums, requests queue in
  submission order, as a Tinker trainer runs them); `optim_step` is free.

Modes: sync, streaming (`StreamMinibatchConfig(groups_per_batch=G, num_minibatches=M)`), and
async (`AsyncConfig(max_steps_off_policy=k, groups_per_batch=G)`, k = 1 and 2). The figures are
steady-state rates, `(n - 1) / (t_n - t_1)` over the completion times `t` of the steps'
optimizer calls (startup excluded), compared with the floor `1 / max(sampling, train)` (a
step can finish no faster than its slowest wait) and the serial rate
`1 / (sampling + train)` (sync's bound). With tinker-cookbook installed (`.cbvenv`), the
cookbook's own `rl.train.main` runs each mode on the same wrapper (its `tinker.ServiceClient`
patched to the latency-injecting fake); ours runs through `shell.cookbook.rl.train.main`. Both train a
cookbook-style env module, the cookbook's as written and ours through the port rule.

The fake SDK, not the local backend, carries the latencies on purpose: the local backend does
a `forward_backward`'s work when it is submitted (the returned future is already done), so
submit-then-await pipelining overlaps nothing there and the modes would measure its compute,
not the loop.

`--overhead` also times the loop's own CPU per step with no latency at 512 rollouts
(64 groups x 8), as the mean wall time of a sync step after a warm-up step.

    .venv/bin/python benchmarks/bench_loop.py --quick          # ours only
    .cbvenv/bin/python benchmarks/bench_loop.py --quick         # ours and the cookbook's
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import importlib.util
import io
import logging
import re
import sys
import tempfile
import time
import types
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import tinker

from rlpure.model import ByteTokenizer
from shell.cookbook.rl import train as our_train
from shell.fakes import FakeSamplingClient, FakeServiceClient, FakeTrainingClient

T = TypeVar("T")
MODEL = "bench/loop"

ENV_SOURCE = """
import asyncio

import chz
import tinker

from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult


class LatencyEnv(Env):
    def __init__(self, problem, index, latency):
        self.problem, self.index, self.latency = problem, index, latency

    async def initial_observation(self):
        return tinker.ModelInput.from_ints([1, 2, 3 + self.problem % 50]), []

    async def step(self, action, *, extra=None):
        await asyncio.sleep(self.latency)
        return StepResult(
            reward=float(self.index % 2),
            episode_done=True,
            next_observation=tinker.ModelInput.empty(),
            next_stop_condition=[],
            metrics={},
        )


class LatencyGroup(EnvGroupBuilder):
    def __init__(self, problem, latency, group_size):
        self.problem, self.latency, self.group_size = problem, latency, group_size

    async def make_envs(self):
        return [LatencyEnv(self.problem, i, self.latency) for i in range(self.group_size)]

    def logging_tags(self):
        return ["bench"]


class LatencyDataset(RLDataset):
    def __init__(self, groups, group_size, num_batches, sampling, env):
        self.groups, self.group_size, self.num_batches = groups, group_size, num_batches
        self.sampling, self.env = sampling, env

    def get_batch(self, index):
        return [
            LatencyGroup(
                index * self.groups + p,
                self.sampling * (p + 1) / self.groups + self.env,
                self.group_size,
            )
            for p in range(self.groups)
        ]

    def __len__(self):
        return self.num_batches


@chz.chz
class LatencyDatasetBuilder(RLDatasetBuilder):
    groups: int
    group_size: int
    num_batches: int
    sampling: float
    env: float

    async def __call__(self):
        return LatencyDataset(
            self.groups, self.group_size, self.num_batches, self.sampling, self.env
        ), None
"""


def _module(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    sys.modules[name] = module  # chz looks the module up while the class body runs
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


OUR_ENV = _module(
    "bench_loop_env",
    re.sub(r"^from tinker_cookbook\b", "from shell.cookbook", ENV_SOURCE, flags=re.M),
)


# --- the latency-injecting fake SDK --------------------------------------------------------------


class _Trainer:
    """One serial trainer: each request holds it for its cost, in submission order."""

    def __init__(self, seconds_per_datum: float) -> None:
        self.seconds_per_datum = seconds_per_datum
        self.busy_until = 0.0
        self.optim_done: list[float] = []

    def submit(self, num_datums: int) -> float:
        now = time.perf_counter()
        self.busy_until = max(now, self.busy_until) + num_datums * self.seconds_per_datum
        return self.busy_until


class _DueFuture(tinker.APIFuture[T]):
    """An `APIFuture` whose value is ready at `due` (a `time.perf_counter()` time)."""

    def __init__(self, value: T, due: float, on_done: list[float] | None = None) -> None:
        self._value, self._due, self._on_done = value, due, on_done

    async def result_async(self, timeout: float | None = None) -> T:
        await asyncio.sleep(max(0.0, self._due - time.perf_counter()))
        if self._on_done is not None:
            self._on_done.append(time.perf_counter())
            self._on_done = None
        return self._value

    def result(self, timeout: float | None = None) -> T:
        time.sleep(max(0.0, self._due - time.perf_counter()))
        return self._value

    def future(self) -> concurrent.futures.Future[T]:
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        done.set_result(self._value)
        return done


class _LatentTrainingClient(FakeTrainingClient):
    trainer: _Trainer
    sample_latency: float

    def forward_backward(self, data: Any, loss_fn: str, loss_fn_config: Any = None) -> Any:
        ready = super().forward_backward(data, loss_fn, loss_fn_config)
        return _DueFuture(ready._value, self.trainer.submit(len(data)))

    def optim_step(self, optim_params: Any = None, *, adam_params: Any = None) -> Any:
        ready = super().optim_step(optim_params, adam_params=adam_params)
        return _DueFuture(ready._value, self.trainer.submit(0), self.trainer.optim_done)

    def save_weights_and_get_sampling_client(self, *args: Any, **kwargs: Any) -> Any:
        ready = super().save_weights_and_get_sampling_client(*args, **kwargs)
        ready._value.latency = self.sample_latency
        return ready

    def create_sampling_client(
        self, model_path: str, retry_config: Any = None, record_stability_info: bool = False
    ) -> Any:  # the one call the cookbook's async loop makes that ours does not
        client = FakeSamplingClient(
            version=int(self.store.load(model_path)["optim_steps"]),
            vocab_size=self.vocab_size,
            events=self.events,
            latency=self.sample_latency,
        )
        return _DueFuture(client, 0.0)


class LatentService(FakeServiceClient):
    """`FakeServiceClient` with the trainer and sampler latencies above; also opens as the
    cookbook opens `tinker.ServiceClient` (keyword options, a context manager)."""

    seconds_per_datum = 0.0
    sample_latency = 0.0
    made: list[LatentService] = []  # noqa: RUF012 - the instances, for the cookbook's side

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.trainer = _Trainer(self.seconds_per_datum)
        LatentService.made.append(self)

    def _training_client(self, base_model: str, rank: int) -> FakeTrainingClient:
        client = _LatentTrainingClient(
            base_model=base_model, rank=rank, store=self.store, events=self.events
        )
        client.trainer, client.sample_latency = self.trainer, self.sample_latency
        self.training_clients.append(client)
        return client

    def __enter__(self) -> LatentService:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


# --- runs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    groups: int
    group_size: int
    steps: int
    sampling: float
    env: float
    train: float
    num_minibatches: int


def _modes(shape: Shape) -> dict[str, dict[str, Any]]:
    stream = our_train.StreamMinibatchConfig(
        groups_per_batch=shape.groups, num_minibatches=shape.num_minibatches
    )
    return {
        "sync": {},
        f"stream (M={shape.num_minibatches})": {"stream_minibatch_config": stream},
        **{
            f"async (off-policy {k})": {
                "async_config": our_train.AsyncConfig(
                    max_steps_off_policy=k, groups_per_batch=shape.groups, loss_fn="ppo"
                )
            }
            for k in (1, 2)
        },
    }


def _steady_rate(done: Sequence[float]) -> float:
    return (len(done) - 1) / (done[-1] - done[0])


def _config(module: Any, shape: Shape, log_path: Path, mode: dict[str, Any]) -> dict[str, Any]:
    return {
        "learning_rate": 1e-3,
        "dataset_builder": module.LatencyDatasetBuilder(
            groups=shape.groups,
            group_size=shape.group_size,
            num_batches=shape.steps,
            sampling=shape.sampling,
            env=shape.env,
        ),
        "model_name": MODEL,
        "recipe_name": "bench_loop",
        "max_tokens": 4,
        "log_path": str(log_path),
        "eval_every": 0,
        "save_every": 0,
        "num_groups_to_log": 0,
        **mode,
    }


def _service_for(shape: Shape) -> None:
    LatentService.seconds_per_datum = shape.train / (shape.groups * shape.group_size)
    LatentService.sample_latency = 0.0
    LatentService.made.clear()


def _quietly(run: Any) -> None:
    """Runs `asyncio.run(run)` with the loops' progress lines and bars discarded."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        asyncio.run(run)


def run_ours(shape: Shape, mode: dict[str, Any], log_path: Path) -> float:
    _service_for(shape)
    service = LatentService()
    config = our_train.Config(**_config(OUR_ENV, shape, log_path, mode))
    _quietly(our_train.main(config, service_client=service))
    return _steady_rate(service.trainer.optim_done)


def _cookbook() -> Any | None:
    if importlib.util.find_spec("tinker_cookbook") is None:
        return None
    import tinker_cookbook.rl.train as cookbook_train
    from tinker_cookbook import tokenizer_utils

    tokenizer_utils.register_tokenizer(MODEL, ByteTokenizer)
    cookbook_train.fetch_model_pricing = lambda model_name: None  # offline
    cookbook_train.print_group = lambda *args, **kwargs: None  # its per-step console dump
    return cookbook_train


def run_cookbook(cookbook: Any, shape: Shape, mode: dict[str, Any], log_path: Path) -> float:
    _service_for(shape)
    env = _module("bench_loop_cookbook_env", ENV_SOURCE)
    translated: dict[str, Any] = {}
    for key, value in mode.items():
        if isinstance(value, our_train.StreamMinibatchConfig):
            translated[key] = cookbook.StreamMinibatchConfig(
                groups_per_batch=value.groups_per_batch, num_minibatches=value.num_minibatches
            )
        else:
            translated[key] = cookbook.AsyncConfig(
                max_steps_off_policy=value.max_steps_off_policy,
                groups_per_batch=value.groups_per_batch,
                loss_fn=value.loss_fn,
            )
    original = tinker.ServiceClient
    tinker.ServiceClient = LatentService  # type: ignore[misc,assignment]
    try:
        _quietly(cookbook.main(cookbook.Config(**_config(env, shape, log_path, translated))))
    finally:
        tinker.ServiceClient = original  # type: ignore[misc]
    (service,) = LatentService.made
    return _steady_rate(service.trainer.optim_done)


def loop_overhead_per_step(log_dir: Path) -> float:
    """Mean seconds of a sync step at 512 rollouts (64 groups x 8) with no latency."""
    shape = Shape(
        groups=64, group_size=8, steps=4, sampling=0.0, env=0.0, train=0.0, num_minibatches=1
    )
    _service_for(shape)
    service = LatentService()
    config = our_train.Config(**_config(OUR_ENV, shape, log_dir, {}))
    _quietly(our_train.main(config, service_client=service))
    return 1 / _steady_rate(service.trainer.optim_done)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sampling", type=float, default=0.2, help="slowest group's seconds")
    parser.add_argument("--env", type=float, default=0.0, help="extra env seconds per step")
    parser.add_argument("--train", type=float, default=0.2, help="training seconds per step")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--minibatches", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="small and short (6 steps, 0.1 s)")
    parser.add_argument("--no-cookbook", action="store_true")
    parser.add_argument("--overhead", action="store_true", help="also time 512-rollout steps")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.sampling, args.train = 6, 0.1, 0.1
    shape = Shape(
        groups=args.groups,
        group_size=args.group_size,
        steps=args.steps,
        sampling=args.sampling,
        env=args.env,
        train=args.train,
        num_minibatches=args.minibatches,
    )
    logging.disable(logging.WARNING)  # the loops' per-step INFO lines and warnings
    cookbook = None if args.no_cookbook else _cookbook()
    sample = shape.sampling + shape.env
    floor, serial = 1 / max(sample, shape.train), 1 / (sample + shape.train)
    print(
        f"sampling {sample:.3f} s (slowest group), train {shape.train:.3f} s per step, "
        f"{shape.groups} groups x {shape.group_size}, {shape.steps} steps"
    )
    print(f"floor 1/max = {floor:.2f} steps/s, serial 1/sum = {serial:.2f} steps/s")
    header = f"{'mode':<22} {'ours steps/s':>12} {'/ sync':>7} {'/ floor':>8}"
    if cookbook is not None:
        header += f" {'cookbook':>9} {'ours / cookbook':>16}"
    print(header)
    rates: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, mode) in enumerate(_modes(shape).items()):
            rates[name] = ours = run_ours(shape, mode, Path(tmp) / f"ours{i}")
            line = f"{name:<22} {ours:>12.2f} {ours / rates['sync']:>7.2f} {ours / floor:>8.2f}"
            if cookbook is not None:
                theirs = run_cookbook(cookbook, shape, mode, Path(tmp) / f"cookbook{i}")
                line += f" {theirs:>9.2f} {ours / theirs:>16.2f}"
            print(line, flush=True)
        if args.overhead:
            seconds = loop_overhead_per_step(Path(tmp) / "overhead")
            print(f"loop CPU per sync step at 512 rollouts, no latency: {seconds * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
