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

Beside figure 1, the floor: the same step through the SDK against `floor_app`, a Starlette app
on the same uvicorn set-up that answers every route at once with canned results (a subprocess,
`--floor-server`). Its step time, less building the datums (client work both sides share), is
the SDK's and HTTP's own cost, which no server can remove: in-process + floor bounds what the
server can reach, and the rest of B - A is rlpure serve's own. Then one `optim_step` (a future:
POST, then `retrieve_future`) on each of the three, the per-request figure.

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
import json
import multiprocessing
import os
import pickle
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import tinker
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from tinker import types
from tinker.proto import tinker_public_pb2 as pb

from shell.timing import matmul_gflops

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
    datums_s: float  # the client's own work in `train_s`: building the datums
    digest: str  # of the sampled tokens


class Round(NamedTuple):
    seconds: float
    tokens: int


# --- the server ---------------------------------------------------------------------------------


_BOUND_URL = re.compile(r"(?:rlpure serve|floor): (http://127\.0\.0\.1:\d+) ")
"""The banner either server prints once its socket is bound to the port it chose."""


def _bound_url(process: subprocess.Popen[bytes], log: Path) -> str:
    """The URL in the server's banner (it binds `--port 0` itself, so no other process can
    take the port between a choice here and its bind)."""
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        found = _BOUND_URL.search(log.read_text(errors="replace"))
        if found:
            return found.group(1)
        if process.poll() is not None:
            raise RuntimeError(f"server exited ({process.returncode}):\n{log.read_text()}")
        time.sleep(0.1)
    raise RuntimeError(f"server bound no port in {STARTUP_S} s:\n{log.read_text()}")


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
    """`rlpure serve` on a loopback port it chooses (as tests/serve/server.py); yields its URL."""
    rlpure = Path(sys.executable).with_name("rlpure")
    command = [str(rlpure), "serve", "--port", "0", "--state-dir", str(state_dir / "state")]
    command += ["-v"] if os.environ.get("BENCH_SERVE_LOG") else []
    log = Path(os.environ.get("BENCH_SERVE_LOG") or state_dir / "serve.log")
    with _server_process(command, log) as url:
        yield url


@contextlib.contextmanager
def floor_server(directory: Path) -> Iterator[str]:
    """The floor app (`floor_app`) in a subprocess on a loopback port it chooses; yields its URL."""
    command = [sys.executable, __file__, "--floor-server"]
    with _server_process(command, directory / "floor.log") as url:
        yield url


@contextlib.contextmanager
def _server_process(command: list[str], log: Path) -> Iterator[str]:
    """Runs `command` (a server that binds a loopback port and prints it, output to `log`)
    until it answers `/api/v1/healthz`, yields its URL, then stops it (killed if it does not
    exit in 60 s)."""
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    try:
        url = _bound_url(process, log)
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


# --- the floor: an instant server on the same stack ---------------------------------------------


JSON_TYPE, PROTO_TYPE = "application/json", "application/x-protobuf"


def _reply(data: object) -> Response:
    return Response(json.dumps(data).encode(), media_type=JSON_TYPE)


class FloorApi:
    """The floor's handlers: each answers at once; a future's result waits in `results` for its
    `retrieve_future`."""

    def __init__(self, client_config: dict[str, Any]) -> None:
        self.client_config = client_config
        self.results: dict[str, tuple[bytes, str]] = {}

    def _future(self, body: bytes, media_type: str = JSON_TYPE, **extra: Any) -> Response:
        request_id = uuid.uuid4().hex
        self.results[request_id] = (body, media_type)
        return _reply({"request_id": request_id, **extra})

    async def fixed(self, request: Request) -> Response:
        await request.body()
        return _reply(
            {
                "client/config": self.client_config,
                "create_session": {"session_id": f"s-{uuid.uuid4().hex[:12]}"},
                "session_heartbeat": {"type": "session_heartbeat"},
                "get_server_capabilities": {"supported_models": [{"model_name": MODEL}]},
            }.get(request.url.path.removeprefix("/api/v1/"), {})
        )

    async def create_model(self, request: Request) -> Response:
        body = json.loads(await request.body())
        model_id = f"{body['session_id']}:train:{body['model_seq_id']}"
        return self._future(json.dumps({"model_id": model_id}).encode(), model_id=model_id)

    async def get_info(self, request: Request) -> Response:
        body = json.loads(await request.body())
        data = {"arch": "floor", "model_name": MODEL, "tokenizer_id": MODEL}
        return _reply({"model_id": body["model_id"], "model_data": data, "is_lora": True})

    async def save_for_sampler(self, request: Request) -> Response:
        body = json.loads(await request.body())
        session_id = body["model_id"].split(":train:")[0]
        sampler = f"{session_id}:sample:{body['sampling_session_seq_id']}"
        return self._future(json.dumps({"sampling_session_id": sampler}).encode())

    async def asample(self, request: Request) -> Response:
        body = json.loads(await request.body())
        tokens = body["sampling_params"]["max_tokens"]
        message = pb.SampleResponse()
        for _ in range(body["num_samples"]):
            sequence = message.sequences.add()
            sequence.stop_reason = pb.STOP_REASON_LENGTH
            sequence.tokens = np.zeros(tokens, np.int32).tobytes()
            sequence.logprobs = np.zeros(tokens, np.float32).tobytes()
        request_id = uuid.uuid4().hex
        self.results[request_id] = (message.SerializeToString(), PROTO_TYPE)
        ids = [f"{request_id}-{index}" for index in range(body["num_samples"])]
        return _reply({"request_id": request_id, "sample_sequence_ids": ids})

    async def forward_backward(self, request: Request) -> Response:
        call = pb.ForwardBackwardRequest()
        call.ParseFromString(await request.body())
        lengths = [
            sum(len(chunk.encoded_text.tokens) // 4 for chunk in datum.model_input)
            for datum in call.data
        ]
        offsets = np.concatenate([[0], np.cumsum(lengths) * 4]).astype(np.int64)
        record = pb.ArrayRecord(type_tag="ArrayRecord", num_datums=len(lengths))
        record.fields["logprobs"].CopyFrom(
            pb.BatchedTensor(
                data=np.zeros(sum(lengths), np.float32).tobytes(),
                offsets=offsets.tobytes(),
                dtype=pb.DTYPE_FLOAT32,
            )
        )
        output = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
        output.loss_fn_outputs.append(record)
        return self._future(output.SerializeToString(), PROTO_TYPE, model_id=call.model_id)

    async def optim_step(self, request: Request) -> Response:
        body = json.loads(await request.body())
        return self._future(b'{"metrics": {}}', model_id=body["model_id"])

    async def retrieve_future(self, request: Request) -> Response:
        body = json.loads(await request.body())
        content, media_type = self.results.pop(body["request_id"])
        return Response(content, media_type=media_type)


def floor_app() -> Starlette:
    """A Starlette app that answers the routes of a GRPO step at once with canned results.

    It does what any server of this API must (read the body, JSON or protobuf, and answer a
    future's `retrieve_future` with its result: an `asample` gets `num_samples` sequences of
    `max_tokens` tokens, a `forward_backward` zero logprobs for each datum's targets) and
    nothing else: no model, no checks, no middleware. The SDK's step against it is the part
    of the HTTP overhead that no server can remove.
    """
    from shell.serve import CLIENT_CONFIG  # imports JAX: only in the floor's own process

    api = FloorApi(CLIENT_CONFIG)
    v1, post = "/api/v1", ["POST"]
    routes = [
        Route(f"{v1}/create_model", api.create_model, methods=post),
        Route(f"{v1}/get_info", api.get_info, methods=post),
        Route(f"{v1}/save_weights_for_sampler", api.save_for_sampler, methods=post),
        Route(f"{v1}/asample", api.asample, methods=post),
        Route(f"{v1}/forward_backward", api.forward_backward, methods=post),
        Route(f"{v1}/optim_step", api.optim_step, methods=post),
        Route(f"{v1}/retrieve_future", api.retrieve_future, methods=post),
        Route(f"{v1}/{{rest:path}}", api.fixed, methods=["GET", "POST"]),
    ]
    return Starlette(routes=routes)


def serve_floor() -> None:
    """Runs `floor_app` on a loopback port of its choosing as `rlpure serve` runs its app
    (uvicorn, `TCP_NODELAY`), after printing `floor: <url> ` for `floor_server`."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    print(f"floor: http://127.0.0.1:{sock.getsockname()[1]} ", flush=True)
    config = uvicorn.Config(floor_app(), log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


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
    built = time.perf_counter()
    fb = training.forward_backward(data_D, "importance_sampling")
    optim = training.optim_step(types.AdamParams(learning_rate=1e-4))
    await fb
    await optim
    digest = hashlib.sha256(
        str([[s.tokens for s in r.sequences] for r in responses_P]).encode()
    ).hexdigest()[:12]
    return StepTimes(sampled - start, time.perf_counter() - sampled, built - sampled, digest)


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


def _total(step: StepTimes) -> float:
    return step.sample_s + step.train_s


async def measure_steps(local: Any, remote: Any, floor: Any, sizes: Sizes, repeats: int) -> None:
    """Section 1: `WARMUP_STEPS` steps each (compiles), then A, B and the floor alternate.

    The floor is the same step through the SDK against `floor_app` (instant answers): its
    time less its datum building is the SDK's and HTTP's own cost, which adds to in-process
    compute however fast the server is.
    """
    clients = {"in-process": local, "HTTP": remote, "floor": floor}
    warm = dict.fromkeys(clients, 0.0)
    for step in range(WARMUP_STEPS):
        for name, client in clients.items():
            started = time.perf_counter()
            await grpo_step(client, sizes, step)
            warm[name] += time.perf_counter() - started
    print(
        f"  {WARMUP_STEPS} warm-up steps (compiles): in-process {warm['in-process']:.1f} s, "
        f"HTTP {warm['HTTP']:.1f} s"
    )
    steps: dict[str, list[StepTimes]] = {name: [] for name in clients}
    for step in range(WARMUP_STEPS, WARMUP_STEPS + repeats):
        for name, client in clients.items():
            steps[name].append(await grpo_step(client, sizes, step))
    for name in ("in-process", "HTTP"):
        print(
            f"  {name:<10} step {_spread([_total(s) for s in steps[name]], ' s')}; "
            f"sample {statistics.median(s.sample_s for s in steps[name]):.3f} s, "
            f"train {statistics.median(s.train_s for s in steps[name]):.3f} s"
        )
    local_S, remote_S = steps["in-process"], steps["HTTP"]
    local_s = statistics.median(_total(a) for a in local_S)
    remote_s = statistics.median(_total(b) for b in remote_S)
    ratio = remote_s / local_s
    pairs = [_total(b) / _total(a) for a, b in zip(local_S, remote_S, strict=True)]
    same = sum(a.digest == b.digest for a, b in zip(local_S, remote_S, strict=True))
    verdict = "OK" if ratio <= TARGET_STEP_RATIO else "over target"
    print(
        f"  HTTP / in-process: {ratio:.2f}x (target <= {TARGET_STEP_RATIO}): {verdict}; "
        f"per pair {_spread(pairs, 'x', digits=2)}"
    )
    print(f"  steps whose sampled tokens match in-process: {same} of {repeats}")
    sdk_s = statistics.median(_total(f) - f.datums_s for f in steps["floor"])
    print(
        f"  floor (the SDK against an instant server on the same stack): step "
        f"{_spread([_total(f) for f in steps['floor']], ' s')}, {sdk_s:.3f} s without "
        f"building datums; in-process + that = {(local_s + sdk_s) / local_s:.2f}x; "
        f"of the {remote_s - local_s:.3f} s the server adds, "
        f"{remote_s - local_s - sdk_s:.3f} s is rlpure serve's own"
    )
    await measure_round_trips(clients)


async def measure_round_trips(clients: dict[str, Any], count: int = 20) -> None:
    """The median `optim_step` (one future: POST, then `retrieve_future`) on each client."""
    params = types.AdamParams(learning_rate=0.0)
    times: dict[str, list[float]] = {name: [] for name in clients}
    for _ in range(count):
        for name, client in clients.items():
            started = time.perf_counter()
            await client.optim_step(params)
            times[name].append(time.perf_counter() - started)
    print(
        "  one optim_step (a future: POST + retrieve_future), median of "
        f"{count}: "
        + ", ".join(f"{name} {1000 * statistics.median(t):.1f} ms" for name, t in times.items())
    )


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


def _matmul_rate() -> str:
    """The machine's speed now (`shell.timing.matmul_gflops`)."""
    return f"2048³ jnp.matmul {matmul_gflops():.0f} GFLOP/s"


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


async def run(
    url: str, floor_url: str, sizes: Sizes, repeats: int, *, full: bool, model: str = MODEL
) -> None:
    from shell.local import LocalServiceClient  # imports JAX: not in the spawned children

    with (
        LocalServiceClient(seed=0, temporary_checkpoints=True) as local_service,
        tinker.ServiceClient(base_url=url, api_key=API_KEY) as remote_service,
        tinker.ServiceClient(base_url=floor_url, api_key=API_KEY) as floor_service,
    ):
        print(f"  {_matmul_rate()}")
        local = await local_service.create_lora_training_client(base_model=model)
        remote = await remote_service.create_lora_training_client(base_model=model)
        floor = await floor_service.create_lora_training_client(base_model=model)
        print(
            f"1. GRPO step: {sizes.prompts} prompts x {sizes.samples} samples, "
            f"{sizes.step_tokens} new tokens, {sizes.prompts * sizes.samples} datums; "
            f"{repeats} rounds"
        )
        await measure_steps(local, remote, floor, sizes, repeats)
        local_sampler = await local_service.create_sampling_client(base_model=model)
        remote_sampler = await remote_service.create_sampling_client(base_model=model)
        print(
            f"2. sampling: {sizes.requests} concurrent requests x {sizes.request_samples} "
            f"samples, {sizes.request_tokens} new tokens; {repeats} rounds"
        )
        spawned = SpawnedClients(remote_sampler, sizes, repeats + 1) if full else None
        try:
            await measure_sampling(local_sampler, remote_sampler, sizes, repeats, spawned)
            print(f"  {_matmul_rate()}")
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
    parser.add_argument("--floor-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.floor_server:  # the floor's own process (`floor_server`)
        serve_floor()
        return 0
    sizes = QUICK if args.quick else Sizes()
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 5)
    if repeats < 1:
        parser.error(f"--repeats: expected >= 1, got {repeats}")
    print(f"rlpure serve vs in-process, model {args.model}; {_load()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        started = time.perf_counter()
        with (
            running_server(Path(tmp)) as url,
            floor_server(Path(tmp)) as floor_url,
            sdk_environment(url),
        ):
            print(f"server healthy after {time.perf_counter() - started:.1f} s at {url}")
            asyncio.run(run(url, floor_url, sizes, repeats, full=args.full, model=args.model))
    print(f"after: {_load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
