"""`rlpure serve`'s overhead: the same work in-process and through the tinker SDK over HTTP.

Two figures, each a ratio against the in-process local backend measured in the same run
(`LocalServiceClient(seed=0, temporary_checkpoints=True)`, model `rlpure/tiny`), with the
server (`rlpure serve` on a free loopback port, a subprocess) driven by the unmodified SDK:

1. A small GRPO step: `save_weights_and_get_sampling_client` → 8 prompts × 8 samples of 16
   new tokens (`asyncio.gather` of awaited `sample` calls) → 64 `importance_sampling` datums
   (advantages centred per group) → `forward_backward` → `optim_step`. Median wall time of a
   step in-process (A) and over HTTP (B); target B / A ≤ 1.2.
2. Sampling throughput with 32 concurrent requests (32 prompts × 4 samples, 32 new tokens) on
   a base-model sampler: sampled tokens/s of one in-process caller (`asyncio.gather`, which
   the local backend batches) and of the SDK (one process, `asyncio.gather`); with `--full`
   also 4 spawned processes × 8 requests each on a pickled SDK sampling client.

Both sides compile first (two warm-up steps and a warm-up round each), then A and B alternate
for `--repeats` rounds: the median, best and worst are printed. The server gathers sample
requests until none arrived for a few milliseconds (`shell.serve._engine`), so a round whose
requests arrive with longer gaps (a busy client) is served in several calls, and a measured
round can still compile a new batch-size bucket (seconds: the worst figure; the median is the
steady state). Both sides make the same calls on the same seed; the script counts the steps
whose sampled tokens agree (the server keys unseeded requests by the SDK's seq_id, so they
should). Client and server share the machine's CPUs (on a 2-core VM, with whatever else runs),
so the load average is printed before and after. `BENCH_SERVE_LOG=FILE` runs the server with
`-v` and keeps its log there (one line per gathered batch of samples).

    .venv/bin/python benchmarks/bench_serve.py              # 5 repeats
    .venv/bin/python benchmarks/bench_serve.py --full       # plus 4 processes x 8 requests
    .venv/bin/python benchmarks/bench_serve.py --quick      # 1 repeat, small sizes (smoke)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import multiprocessing
import os
import pickle
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import tinker
from tinker import types

MODEL = "rlpure/tiny"
API_KEY = "tml-local"
BOS = 256  # the byte tokenizer's BOS (`rlpure.model.ByteTokenizer`); tokens 0-255 are bytes
TARGET_STEP_RATIO = 1.2
STARTUP_S = 180.0
PROCESSES = 4
WARMUP_STEPS = 2  # the first compiles; the second samples weights an optim_step made


@dataclass(frozen=True)
class Sizes:
    """The work of one step and of one sampling round."""

    prompts: int = 8
    samples: int = 8
    step_tokens: int = 16
    requests: int = 32
    request_samples: int = 4
    request_tokens: int = 32


# The quick sampling round has the step's shapes (32 rows, 8 new tokens, prompts in one length
# bucket), so each side compiles one sampler.
QUICK = Sizes(prompts=4, samples=8, step_tokens=8, requests=32, request_samples=1, request_tokens=8)


class StepTimes(NamedTuple):
    sample_s: float  # save weights + sample
    train_s: float  # datums + forward_backward + optim_step
    digest: str  # of the sampled tokens


class Round(NamedTuple):
    seconds: float
    tokens: int


# --- the server ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"rlpure serve exited ({process.returncode}):\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"{url}/api/v1/healthz", timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    raise RuntimeError(f"rlpure serve did not answer in {STARTUP_S} s:\n{log.read_text()}")


@contextlib.contextmanager
def running_server(state_dir: Path) -> Iterator[str]:
    """`rlpure serve` on a free loopback port (as tests/serve/server.py); yields its URL."""
    port = _free_port()
    rlpure = Path(sys.executable).with_name("rlpure")
    command = [str(rlpure), "serve", "--port", str(port), "--state-dir", str(state_dir / "state")]
    command += ["-v"] if os.environ.get("BENCH_SERVE_LOG") else []
    log = Path(os.environ.get("BENCH_SERVE_LOG") or state_dir / "serve.log")
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process, log)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def sdk_environment(url: str) -> Iterator[None]:
    """The SDK's variables (also for spawned children), restored on exit."""
    values = {"TINKER_BASE_URL": url, "TINKER_API_KEY": API_KEY, "TINKER_TELEMETRY": "0"}
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# --- the work -----------------------------------------------------------------------------------


def _prompt(text: str) -> types.ModelInput:
    return types.ModelInput.from_ints([BOS, *text.encode()])


def _datum(
    prompt: list[int], tokens: list[int], logprobs: list[float], advantage: float
) -> types.Datum:
    """An `importance_sampling` datum: position i of `model_input` predicts `target_tokens[i]`;
    prompt positions carry logprob 0 and advantage 0."""
    prompt_targets = len(prompt) - 1
    targets = np.asarray(prompt[1:] + tokens, dtype=np.int64)
    return types.Datum(
        model_input=types.ModelInput.from_ints(prompt + tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(targets),
            "logprobs": types.TensorData.from_numpy(
                np.asarray([0.0] * prompt_targets + logprobs, dtype=np.float32)
            ),
            "advantages": types.TensorData.from_numpy(
                np.asarray([0.0] * prompt_targets + [advantage] * len(tokens), dtype=np.float32)
            ),
        },
    )


def _group_datums(prompt: list[int], response: types.SampleResponse) -> list[types.Datum]:
    """The group's datums; reward = fraction of even tokens, advantages centred per group."""
    tokens_G = [list(sequence.tokens) for sequence in response.sequences]
    rewards_G = np.asarray([np.mean(np.asarray(t) % 2 == 0) for t in tokens_G])
    advantages_G = rewards_G - rewards_G.mean()
    return [
        _datum(prompt, tokens, list(sequence.logprobs or []), float(advantage))
        for tokens, sequence, advantage in zip(
            tokens_G, response.sequences, advantages_G, strict=True
        )
    ]


async def grpo_step(training: Any, sizes: Sizes, step: int) -> StepTimes:
    """One step on `training` (a local or an SDK training client, same async API)."""
    start = time.perf_counter()
    sampler = await training.save_weights_and_get_sampling_client()
    params = types.SamplingParams(max_tokens=sizes.step_tokens, temperature=1.0, stop=[])
    prompts_P = [_prompt(f"step {step:04d} problem {p:03d}:") for p in range(sizes.prompts)]
    responses_P = await asyncio.gather(
        *(sampler.sample(prompt, sizes.samples, params) for prompt in prompts_P)
    )
    sampled = time.perf_counter()
    data_D = [
        datum
        for prompt, response in zip(prompts_P, responses_P, strict=True)
        for datum in _group_datums(prompt.to_ints(), response)
    ]
    fb = training.forward_backward(data_D, "importance_sampling")
    optim = training.optim_step(types.AdamParams(learning_rate=1e-4))
    await fb
    await optim
    digest = hashlib.sha256(
        str([[s.tokens for s in r.sequences] for r in responses_P]).encode()
    ).hexdigest()[:12]
    return StepTimes(sampled - start, time.perf_counter() - sampled, digest)


def _requests(sizes: Sizes, first: int, count: int) -> list[list[int]]:
    return [_prompt(f"concurrent request {r:03d}:").to_ints() for r in range(first, first + count)]


async def sample_round(sampler: Any, prompts: Sequence[list[int]], sizes: Sizes) -> Round:
    """`len(prompts)` concurrent `sample` calls on `sampler`, awaited together."""
    params = types.SamplingParams(max_tokens=sizes.request_tokens, temperature=1.0, stop=[])
    start = time.perf_counter()
    responses = await asyncio.gather(
        *(
            sampler.sample(types.ModelInput.from_ints(p), sizes.request_samples, params)
            for p in prompts
        )
    )
    seconds = time.perf_counter() - start
    return Round(seconds, sum(len(s.tokens) for r in responses for s in r.sequences))


# --- 4 processes x 8 requests (--full) ----------------------------------------------------------


def _child(
    sampler_pickle: bytes,
    prompts: list[list[int]],
    sizes: Sizes,
    rounds: int,
    barrier: Any,
    queue: Any,
) -> None:
    """Per round: wait for the others, sample, report `(start, end, tokens)` (monotonic)."""
    sampler = pickle.loads(sampler_pickle)

    async def rounds_() -> None:
        for _ in range(rounds):
            await asyncio.to_thread(barrier.wait)
            start = time.monotonic()
            done = await sample_round(sampler, prompts, sizes)
            queue.put((start, start + done.seconds, done.tokens))

    asyncio.run(rounds_())


class SpawnedClients:
    """`PROCESSES` spawned processes sharing one pickled SDK sampling client."""

    def __init__(self, sampler: Any, sizes: Sizes, rounds: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.barrier = context.Barrier(PROCESSES + 1)
        self.queue = context.Queue()
        share = sizes.requests // PROCESSES
        self.processes = [
            context.Process(
                target=_child,
                args=(
                    pickle.dumps(sampler),
                    _requests(sizes, i * share, share),
                    sizes,
                    rounds,
                    self.barrier,
                    self.queue,
                ),
                daemon=True,
            )
            for i in range(PROCESSES)
        ]
        for process in self.processes:
            process.start()

    def round(self) -> Round:
        self.barrier.wait(timeout=STARTUP_S)
        results = [self.queue.get(timeout=STARTUP_S) for _ in self.processes]
        start = min(r[0] for r in results)
        return Round(max(r[1] for r in results) - start, sum(r[2] for r in results))

    def close(self) -> None:
        for process in self.processes:
            process.join(timeout=60)
            if process.is_alive():
                process.terminate()


# --- the measurements ---------------------------------------------------------------------------


def _spread(values: Sequence[float], unit: str, *, digits: int = 3, higher: bool = False) -> str:
    """`median (best, worst)`; best is the lowest value unless `higher`."""
    ordered = sorted(values, reverse=higher)
    return (
        f"median {statistics.median(ordered):.{digits}f}{unit} "
        f"(best {ordered[0]:.{digits}f}, worst {ordered[-1]:.{digits}f})"
    )


async def measure_steps(local: Any, remote: Any, sizes: Sizes, repeats: int) -> None:
    """Section 1: `WARMUP_STEPS` steps each (compiles), then A and B alternate."""
    warm = {"in-process": 0.0, "HTTP": 0.0}
    for step in range(WARMUP_STEPS):
        for name, client in (("in-process", local), ("HTTP", remote)):
            started = time.perf_counter()
            await grpo_step(client, sizes, step)
            warm[name] += time.perf_counter() - started
    print(
        f"  {WARMUP_STEPS} warm-up steps (compiles): in-process {warm['in-process']:.1f} s, "
        f"HTTP {warm['HTTP']:.1f} s"
    )
    local_S, remote_S = [], []
    for step in range(WARMUP_STEPS, WARMUP_STEPS + repeats):
        local_S.append(await grpo_step(local, sizes, step))
        remote_S.append(await grpo_step(remote, sizes, step))
    for name, steps in (("in-process", local_S), ("HTTP", remote_S)):
        print(
            f"  {name:<10} step {_spread([s.sample_s + s.train_s for s in steps], ' s')}; "
            f"sample {statistics.median(s.sample_s for s in steps):.3f} s, "
            f"train {statistics.median(s.train_s for s in steps):.3f} s"
        )
    local_s = statistics.median(a.sample_s + a.train_s for a in local_S)
    ratio = statistics.median(b.sample_s + b.train_s for b in remote_S) / local_s
    pairs = [
        (b.sample_s + b.train_s) / (a.sample_s + a.train_s)
        for a, b in zip(local_S, remote_S, strict=True)
    ]
    same = sum(a.digest == b.digest for a, b in zip(local_S, remote_S, strict=True))
    verdict = "OK" if ratio <= TARGET_STEP_RATIO else "over target"
    print(
        f"  HTTP / in-process: {ratio:.2f}x (target <= {TARGET_STEP_RATIO}): {verdict}; "
        f"per pair {_spread(pairs, 'x', digits=2)}"
    )
    print(f"  steps whose sampled tokens match in-process: {same} of {repeats}")


async def measure_sampling(
    local: Any, remote: Any, sizes: Sizes, repeats: int, spawned: SpawnedClients | None
) -> None:
    """Section 2: a warm-up round each, then in-process, SDK (and spawned SDK) alternate."""
    prompts = _requests(sizes, 0, sizes.requests)
    await sample_round(local, prompts, sizes)
    await sample_round(remote, prompts, sizes)
    rates: dict[str, list[float]] = {"in-process": [], "SDK, 1 process": []}
    if spawned is not None:
        rates[f"SDK, {PROCESSES} processes"] = []
        await asyncio.to_thread(spawned.round)
    for _ in range(repeats):
        for name in rates:
            if name == "in-process":
                done = await sample_round(local, prompts, sizes)
            elif name == "SDK, 1 process":
                done = await sample_round(remote, prompts, sizes)
            else:
                assert spawned is not None
                done = await asyncio.to_thread(spawned.round)
            rates[name].append(done.tokens / done.seconds)
    base = statistics.median(rates["in-process"])
    for name, values in rates.items():
        print(
            f"  {name:<16} {_spread(values, ' tokens/s', digits=0, higher=True)}; "
            f"/ in-process {statistics.median(values) / base:.2f}x"
        )


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


async def run(url: str, sizes: Sizes, repeats: int, *, full: bool, model: str = MODEL) -> None:
    from shell.local import LocalServiceClient  # imports JAX: not in the spawned children

    with (
        LocalServiceClient(seed=0, temporary_checkpoints=True) as local_service,
        tinker.ServiceClient(base_url=url, api_key=API_KEY) as remote_service,
    ):
        local = await local_service.create_lora_training_client(base_model=model)
        remote = await remote_service.create_lora_training_client(base_model=model)
        print(
            f"1. GRPO step: {sizes.prompts} prompts x {sizes.samples} samples, "
            f"{sizes.step_tokens} new tokens, {sizes.prompts * sizes.samples} datums; "
            f"{repeats} rounds"
        )
        await measure_steps(local, remote, sizes, repeats)
        local_sampler = await local_service.create_sampling_client(base_model=model)
        remote_sampler = await remote_service.create_sampling_client(base_model=model)
        print(
            f"2. sampling: {sizes.requests} concurrent requests x {sizes.request_samples} "
            f"samples, {sizes.request_tokens} new tokens; {repeats} rounds"
        )
        spawned = SpawnedClients(remote_sampler, sizes, repeats + 1) if full else None
        try:
            await measure_sampling(local_sampler, remote_sampler, sizes, repeats, spawned)
        finally:
            if spawned is not None:
                spawned.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--repeats", type=int, default=None, help="alternating rounds (default 5; --quick: 1)"
    )
    parser.add_argument("--quick", action="store_true", help="1 round, small sizes (smoke test)")
    parser.add_argument("--full", action="store_true", help="also 4 processes x 8 requests")
    parser.add_argument(
        "--model", default=MODEL, help=f"base model (default {MODEL}; e.g. rlpure/small)"
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 5)
    if repeats < 1:
        parser.error(f"--repeats: expected >= 1, got {repeats}")
    print(f"rlpure serve vs in-process, model {args.model}; {_load()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        started = time.perf_counter()
        with running_server(Path(tmp)) as url, sdk_environment(url):
            print(f"server healthy after {time.perf_counter() - started:.1f} s at {url}")
            asyncio.run(run(url, sizes, repeats, full=args.full, model=args.model))
    print(f"after: {_load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
