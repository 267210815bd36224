"""The server's engine: one `LocalServiceClient` on a worker thread, many HTTP clients.

Conventions:
- **One owner.** The local backend's clients are not thread-safe, so every model operation
  runs on one worker thread with its own asyncio loop. HTTP handlers (uvicorn's loop) never
  touch a model: they validate the request, hand the worker an operation with
  `call_soon_threadsafe`, and answer with a request id at once. The operation's outcome, always
  a `Reply` (a failed one included), lands in a `concurrent.futures.Future` that
  `retrieve_future` long-polls (`wait_result`).
- **Batching.** Sample requests are gathered until none arrived for a while (3x the round's
  longest gap between arrivals, 5 to 30 ms; at most 100 ms in all), then
  started in one tick on the worker loop; the local sampling client's batcher serves requests
  started in one tick in one jitted call, so concurrent HTTP clients share calls as in-process
  callers do. An unseeded request is keyed by the SDK's `seq_id` (its number among the
  sampling client's requests), so what it draws does not depend on arrival order.
- **Training order.** Each training model executes its operations in `seq_id` order (the SDK
  numbers them from 1 and may deliver them out of order: parallel `forward_backward` chunks,
  retries); an operation waits until its predecessors have run. A repeated `(model_id, seq_id)`
  (a retried POST) gets the first one's request id, as does a repeated `create_model` /
  create-via-load for one model id or a repeated sample `(sampling_session_id, seq_id)`.
- **Ids.** Sessions are `s-<12 hex>` (unique across restarts); training models
  `{session_id}:train:{model_seq_id}` (the SDK derives that id itself when it creates a model
  from a checkpoint); sampling sessions `{session_id}:sample:{sampling_session_seq_id}`. A
  training model's id is its training run's id and its checkpoint folder
  (`shell.serve._paths`).
- **Memory.** Samplers are built on first use and kept in an LRU of `max_samplers`; one on
  saved weights (a path or a base model) is rebuilt when it is needed again, one on unsaved
  weights (`save_weights_and_get_sampling_client`) cannot be: a request to it then fails with a
  message naming `--max-samplers`. A session's models and samplers are released when it
  finishes or when no heartbeat came for `session_timeout_s`; its checkpoints stay on disk,
  and a later heartbeat for it gets 410 (which stops the SDK's heartbeat loop: pickled
  sampling clients in worker processes keep one each).
- **REST.** The REST client's calls (training runs, checkpoint listings and infos,
  deletions) run on threads of their own (`read_async`), so they answer while the worker
  trains.
- **Shutdown.** `close()` refuses new work, lets the operation that is running finish (a
  checkpoint being written is completed), fails the queued ones with category `server`, and
  stops the worker.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import logging
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tinker import types

from shell.errors import ConfigError
from shell.local import LocalSamplingClient, LocalServiceClient, LocalTrainingClient
from shell.local._tokenizer_dirs import tokenizer_dir_name, write_tokenizer_dir
from shell.serve._paths import CheckpointRef, parse_tinker_path, ref_from_directory
from shell.serve._replies import Reply, failure_reply, json_reply
from shell.serve._ttl import CheckpointTtl

__all__ = ["Engine", "EngineClosed", "SamplerSpec", "SessionEnded", "TrainingOp"]

_logger = logging.getLogger("rlpure.serve")

TrainingOp = Callable[[LocalTrainingClient], Reply]
"""An operation on one training model, run on the worker in `seq_id` order."""

_DONE_KEEP_S = 600.0  # a delivered result stays retrievable this long (a lost response retried)
_GATHER_QUIET_S = 0.005  # samples are started together once none arrived for this long,
_GATHER_QUIET_MAX_S = 0.03  # ... or for 3x the longest gap between this round's arrivals
_GATHER_MAX_S = 0.1  # ... or once the first waited this long
_UNCLAIMED_KEEP_S = 3600.0  # a result nobody fetched (its client died) is dropped after this


class SessionEnded(LookupError):
    """A heartbeat for a session this server finished or released (HTTP 410)."""


class EngineClosed(RuntimeError):
    """The server is shutting down: no new work is accepted."""


@dataclass(frozen=True)
class SamplerSpec:
    """What a sampling session samples from: saved weights, a base model, or a snapshot.

    Exactly one of `ref`, `base_model` or `snapshot_of` is set (`snapshot_of`: the training
    model whose unsaved weights it holds; it cannot be rebuilt once evicted).
    """

    session_id: str
    base_model: str
    ref: CheckpointRef | None = None
    snapshot_of: str | None = None

    @property
    def model_path(self) -> str | None:
        return self.ref.tinker_path if self.ref is not None else None


@dataclass
class _Session:
    created: float
    last_seen: float
    models: set[str] = field(default_factory=set)
    samplers: set[str] = field(default_factory=set)


@dataclass
class _Slot:
    """A training model on the worker: its client and the operations waiting for their turn."""

    client: LocalTrainingClient
    next_seq: int = 1
    waiting: dict[int, tuple[TrainingOp, concurrent.futures.Future[Reply], str]] = field(
        default_factory=dict
    )


@dataclass
class _Pending:
    future: concurrent.futures.Future[Reply]
    what: str
    created: float
    delivered_at: float | None = None
    finished_at: float | None = None  # set when `future` completes (its done callback)

    def __post_init__(self) -> None:
        self.future.add_done_callback(lambda _: setattr(self, "finished_at", time.time()))


class Engine:
    """Owns the local backend for the server (see module doc).

    Args:
        state_dir: the server's durable state (checkpoints under `checkpoints/`, the tokenizer
            directories `get_info` names under `tokenizers/`).
        seed: the local service's seed.
        max_samplers: samplers kept in memory at once.
        session_timeout_s: a session with no heartbeat for this long is released.
        service_options: further `LocalServiceClient` keywords (memory budgets, model configs).
    """

    def __init__(
        self,
        *,
        state_dir: Path,
        seed: int = 0,
        max_samplers: int = 8,
        session_timeout_s: float = 900.0,
        **service_options: Any,
    ) -> None:
        if ":" in str(state_dir.resolve()):
            raise ConfigError(
                f"state dir {state_dir}: its path must not contain ':' (the SDK cuts the "
                "tokenizer directory get_info names at its first ':')"
            )
        state_dir = state_dir.resolve()
        self.state_dir = state_dir
        self.checkpoint_root = state_dir / "checkpoints"
        self.tokenizer_root = state_dir / "tokenizers"
        self.checkpoint_root.mkdir(parents=True, exist_ok=True)
        self.ttl = CheckpointTtl(self.checkpoint_root)
        self.service = LocalServiceClient(
            seed=seed, checkpoint_dir=self.checkpoint_root, **service_options
        )
        self.max_samplers = max_samplers
        self.session_timeout_s = session_timeout_s
        self._lock = threading.Lock()
        self._closed = False
        self._close_done = threading.Event()
        self._futures: dict[str, _Pending] = {}
        self._seen: dict[tuple[str, str, int], str] = {}
        self._sessions: dict[str, _Session] = {}
        self._ended: set[str] = set()  # sessions finished or released (a heartbeat gets 410)
        self._infos: dict[str, types.GetInfoResponse] = {}
        self._specs: dict[str, SamplerSpec] = {}
        self._evicted: set[str] = set()
        # worker-only state
        self._slots: dict[str, _Slot] = {}
        self._samplers: OrderedDict[str, LocalSamplingClient] = OrderedDict()
        self._tokenizer_dirs: dict[str, Path] = {}  # base model → the folder get_info names
        self._sample_queue: list[Callable[[], Coroutine[Any, Any, None]]] = []
        self._dispatcher: asyncio.Task[None] | None = None
        self._arrivals: list[float] = []  # when the queued samples arrived (worker clock)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="rlpure-serve-worker", daemon=True
        )
        self._thread.start()

    # -- requests and futures (any thread) --

    def _new_pending(self, what: str, key: tuple[str, str, int] | None) -> tuple[str, bool]:
        """A request id for `what` (or the id already given to `key`) and whether it is new."""
        with self._lock:
            if self._closed:
                raise EngineClosed("the server is shutting down")
            if key is not None and key in self._seen and self._seen[key] in self._futures:
                return self._seen[key], False
            request_id = uuid.uuid4().hex
            self._futures[request_id] = _Pending(concurrent.futures.Future(), what, time.time())
            if key is not None:
                self._seen[key] = request_id
            return request_id, True

    def purge_results(self) -> int:
        """Forgets results delivered over `_DONE_KEEP_S` ago, or finished over
        `_UNCLAIMED_KEEP_S` ago and never fetched (their client died; counted from the finish,
        so an operation that ran longer than that keeps its result); returns how many. The server's janitor calls
        it, off the request path: the scan is over every request the server still holds."""
        with self._lock:
            return self._purge_locked()

    def _purge_locked(self) -> int:
        now = time.time()
        stale = [
            rid
            for rid, pending in self._futures.items()
            if (pending.delivered_at is not None and now - pending.delivered_at > _DONE_KEEP_S)
            or (pending.finished_at is not None and now - pending.finished_at > _UNCLAIMED_KEEP_S)
        ]
        for rid in stale:
            del self._futures[rid]
        if stale:
            gone = set(stale)
            self._seen = {key: rid for key, rid in self._seen.items() if rid not in gone}
        return len(stale)

    def _future(self, request_id: str) -> concurrent.futures.Future[Reply]:
        with self._lock:
            return self._futures[request_id].future

    async def wait_result(self, request_id: str, timeout_s: float) -> Reply | None:
        """The result of `request_id`, or `None` if it is not ready within `timeout_s`.

        Raises:
            KeyError: an unknown (or long-delivered) request id.
        """
        with self._lock:
            pending = self._futures[request_id]
        if pending.future.done():  # answered at once: wrapping a done future costs a loop wake-up
            reply = pending.future.result()
        else:
            try:
                reply = await asyncio.wait_for(
                    asyncio.shield(asyncio.wrap_future(pending.future)), timeout_s
                )
            except TimeoutError:
                return None
        with self._lock:
            if pending.delivered_at is None:
                pending.delivered_at = time.time()
        return reply

    def queue_depth(self) -> int:
        """Requests submitted and not finished."""
        with self._lock:
            return sum(not pending.future.done() for pending in self._futures.values())

    def _on_worker(
        self, request_id: str, job: Callable[[concurrent.futures.Future[Reply]], Any]
    ) -> str:
        future = self._future(request_id)
        self._loop.call_soon_threadsafe(job, future)
        return request_id

    def call(self, fn: Callable[[], Any], timeout_s: float = 300.0) -> Any:
        """Runs `fn` on the worker and returns its value (or raises its exception)."""
        with self._lock:
            if self._closed:
                raise EngineClosed("the server is shutting down")
        result: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                result.set_result(fn())
            except BaseException as err:  # handed to the caller's thread
                result.set_exception(err)

        self._loop.call_soon_threadsafe(run)
        return result.result(timeout_s)

    async def read_async(self, fn: Callable[[], Any]) -> Any:
        """`fn`'s value, computed on a thread of its own, not the worker: for the REST client's
        work on the checkpoint folders and the runs' records (listings, infos, deletions), which
        touches no model, so that it does not wait behind a `forward_backward` the worker is
        running (minutes on a CPU; the SDK times a request out after 60 s and retries it, so a
        deletion that waited ran again and answered 404). Deleting a checkpoint that an
        operation is loading fails that operation, as the same two requests would on Tinker."""
        with self._lock:
            if self._closed:
                raise EngineClosed("the server is shutting down")
        return await asyncio.to_thread(fn)

    # -- sessions --

    def create_session(self) -> str:
        session_id = f"s-{uuid.uuid4().hex[:12]}"
        with self._lock:
            now = time.time()
            self._sessions[session_id] = _Session(created=now, last_seen=now)
        return session_id

    def touch_session(self, session_id: str) -> None:
        """Records a heartbeat (an unknown session, e.g. after a restart, is adopted).

        Raises:
            SessionEnded: this server finished the session, or released it for want of
                heartbeats (the SDK stops a session's heartbeats when told so: HTTP 410).
        """
        with self._lock:
            if session_id in self._ended:
                raise SessionEnded(f"session_id: session {session_id!r} has finished")
            now = time.time()
            session = self._sessions.setdefault(session_id, _Session(created=now, last_seen=now))
            session.last_seen = now

    def finish_session(self, session_id: str) -> None:
        """Releases the session's models and samplers (its checkpoints stay)."""
        with self._lock:
            session = self._sessions.pop(session_id, None)
            self._ended.add(session_id)
        if session is not None:
            self._release(session)

    def release_idle_sessions(self) -> list[str]:
        """Releases sessions with no heartbeat for `session_timeout_s`; returns their ids."""
        now = time.time()
        with self._lock:
            idle = [
                sid
                for sid, session in self._sessions.items()
                if now - session.last_seen > self.session_timeout_s
            ]
            released = [self._sessions.pop(sid) for sid in idle]
            self._ended.update(idle)
        for session in released:
            self._release(session)
        return idle

    def _release(self, session: _Session) -> None:
        with self._lock:
            for model_id in session.models:
                self._infos.pop(model_id, None)
            for sampler_id in session.samplers:
                self._specs.pop(sampler_id, None)
                self._evicted.discard(sampler_id)

        def drop() -> None:
            for model_id in session.models:
                self._slots.pop(model_id, None)
            for sampler_id in session.samplers:
                self._samplers.pop(sampler_id, None)

        self._loop.call_soon_threadsafe(drop)

    def session_ids(self) -> list[str]:
        """The live sessions, oldest first."""
        with self._lock:
            return sorted(self._sessions, key=lambda sid: self._sessions[sid].created)

    def session_summary(self, session_id: str) -> types.GetSessionResponse:
        """The session's training models and samplers.

        Raises:
            LookupError: an unknown session.
        """
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                raise LookupError(f"unknown session {session_id!r}")
            return types.GetSessionResponse(
                training_run_ids=sorted(session.models), sampler_ids=sorted(session.samplers)
            )

    def _session_locked(self, session_id: str) -> _Session:
        """The session `session_id`, adopted if unknown (call with `_lock` held)."""
        now = time.time()
        return self._sessions.setdefault(session_id, _Session(created=now, last_seen=now))

    # -- training models --

    def info(self, model_id: str) -> types.GetInfoResponse:
        """`get_info` of a training model this server holds.

        Raises:
            KeyError: unknown model id.
        """
        with self._lock:
            return self._infos[model_id]

    def _register_model(self, session_id: str, model_id: str, client: LocalTrainingClient) -> None:
        """Worker: keeps the client, writes its tokenizer directory, records its info."""
        self._slots[model_id] = _Slot(client)
        info = client.get_info()
        name = info.model_data.model_name or ""
        directory = self._tokenizer_dirs.get(name)
        if directory is None:  # once per base model: writing compares every file (~4 MB)
            directory = write_tokenizer_dir(
                client.get_tokenizer(), self.tokenizer_root / tokenizer_dir_name(name)
            )
            self._tokenizer_dirs[name] = directory
        info = info.model_copy(
            update={
                "model_data": info.model_data.model_copy(update={"tokenizer_id": str(directory)})
            }
        )
        with self._lock:
            self._infos[model_id] = info
            self._session_locked(session_id).models.add(model_id)

    def submit_create(
        self, session_id: str, model_id: str, what: str, make: Callable[[], LocalTrainingClient]
    ) -> str:
        """Creates training model `model_id` with `make()` on the worker (a future's request
        id; a repeated request for the same id gets the same request id)."""
        request_id, new = self._new_pending(what, ("create", model_id, 0))
        if not new:
            return request_id

        def job(future: concurrent.futures.Future[Reply]) -> None:
            try:
                if model_id in self._slots:
                    raise FileExistsError(f"model {model_id!r} exists")
                client = make()
                self._register_model(session_id, model_id, client)
                reply = self._created_reply(what, model_id)
            except Exception as err:
                reply = failure_reply(err, what, self.public_message)
            future.set_result(reply)

        return self._on_worker(request_id, job)

    @staticmethod
    def _created_reply(what: str, model_id: str) -> Reply:
        if what == "create_model":
            return json_reply(types.CreateModelResponse(model_id=model_id))
        return json_reply(types.LoadWeightsResponse(model_id=model_id))

    def submit_training(self, model_id: str, seq_id: int, what: str, op: TrainingOp) -> str:
        """Queues `op` on training model `model_id` at `seq_id` (see module doc: order)."""
        request_id, new = self._new_pending(what, ("train", model_id, seq_id))
        if new:
            self._on_worker(
                request_id, lambda future: self._enqueue(model_id, seq_id, op, future, what)
            )
        return request_id

    def skip_training_seq(self, model_id: str, seq_id: int, what: str) -> None:
        """Marks `seq_id` of `model_id` used by a request refused before it was queued (a
        4xx). The SDK counts the number as taken either way, so without this every later
        request of that client would wait for it forever."""
        with self._lock:
            if self._closed:
                return
        refused: concurrent.futures.Future[Reply] = concurrent.futures.Future()  # nobody reads it

        def nothing(client: LocalTrainingClient) -> Reply:
            return failure_reply(ValueError(f"{what} was refused"), what)

        self._loop.call_soon_threadsafe(self._enqueue, model_id, seq_id, nothing, refused, what)

    def _enqueue(
        self,
        model_id: str,
        seq_id: int,
        op: TrainingOp,
        future: concurrent.futures.Future[Reply],
        what: str,
    ) -> None:
        if self._closed:  # queued on the worker before `close`: it never runs
            future.set_result(_shut_down(what))
            return
        slot = self._slots.get(model_id)
        if slot is None:
            future.set_result(
                failure_reply(
                    LookupError(
                        f"unknown model_id {model_id!r} (never created here, or released: its "
                        "session finished or timed out, or the server restarted; create a "
                        "training client from a saved state to continue)"
                    ),
                    what,
                )
            )
            return
        if seq_id < slot.next_seq or seq_id in slot.waiting:
            future.set_result(
                failure_reply(
                    ValueError(f"seq_id {seq_id} of model {model_id!r} was already used"), what
                )
            )
            return
        slot.waiting[seq_id] = (op, future, what)
        while slot.next_seq in slot.waiting:
            ready_op, ready_future, ready_what = slot.waiting.pop(slot.next_seq)
            slot.next_seq += 1
            if self._closed:  # `close` came while an earlier op of this chain ran
                ready_future.set_result(_shut_down(ready_what))
                continue
            try:
                reply = ready_op(slot.client)
            except Exception as err:
                reply = failure_reply(err, ready_what, self.public_message)
            ready_future.set_result(reply)

    def public_message(self, text: str) -> str:
        """`text` with every checkpoint folder under the state dir written as its tinker path
        (an error must not show where the server keeps its files)."""
        root = re.escape(str(self.checkpoint_root))
        pattern = root + r"/([^/'\"\s]+)/(state|sampler)/([^/'\"\s]+)(?:/[^'\"\s]*)?"

        def tinker_path(match: re.Match[str]) -> str:
            kind = "weights" if match.group(2) == "state" else "sampler_weights"
            return f"tinker://{match.group(1)}/{kind}/{match.group(3)}"

        return re.sub(pattern, tinker_path, text).replace(str(self.state_dir), "<state dir>")

    def checkpoint_ref(self, directory: str) -> CheckpointRef:
        """The tinker path of a checkpoint folder the local backend wrote."""
        return ref_from_directory(directory, self.checkpoint_root)

    def resolve(self, path: object, *, field: str = "path") -> tuple[CheckpointRef, str]:
        """A request's tinker path → its reference and the folder under the state dir."""
        ref = parse_tinker_path(path, field=field)
        return ref, str(ref.directory(self.checkpoint_root))

    # -- samplers --

    def add_sampler(self, sampler_id: str, spec: SamplerSpec) -> None:
        """Registers sampling session `sampler_id` (built on first use)."""
        with self._lock:
            self._specs[sampler_id] = spec
            self._evicted.discard(sampler_id)
            self._session_locked(spec.session_id).samplers.add(sampler_id)

    def add_snapshot_sampler(
        self, sampler_id: str, session_id: str, client: LocalSamplingClient, of_model: str
    ) -> None:
        """Worker: registers a sampler on a training model's current (unsaved) weights."""
        self.add_sampler(
            sampler_id,
            SamplerSpec(
                session_id=session_id, base_model=client.get_base_model(), snapshot_of=of_model
            ),
        )
        self._keep_sampler(sampler_id, client)

    def sampler_spec(self, sampler_id: str) -> SamplerSpec:
        """Raises KeyError for an unknown sampling session."""
        with self._lock:
            return self._specs[sampler_id]

    def _keep_sampler(self, sampler_id: str, client: LocalSamplingClient) -> None:
        self._samplers[sampler_id] = client
        self._samplers.move_to_end(sampler_id)
        while len(self._samplers) > self.max_samplers:
            old_id, _ = self._samplers.popitem(last=False)
            with self._lock:
                spec = self._specs.get(old_id)
                if spec is not None and spec.snapshot_of is not None:
                    self._evicted.add(old_id)

    def _sampler(self, sampler_id: str) -> LocalSamplingClient:
        """Worker: the sampling client of `sampler_id`, built if needed."""
        client = self._samplers.get(sampler_id)
        if client is not None:
            self._samplers.move_to_end(sampler_id)
            return client
        with self._lock:
            spec = self._specs.get(sampler_id)
            evicted = sampler_id in self._evicted
        if spec is None:
            raise LookupError(f"unknown sampling_session_id {sampler_id!r}")
        if evicted or spec.snapshot_of is not None:
            raise LookupError(
                f"sampling session {sampler_id!r} held unsaved weights of {spec.snapshot_of!r} "
                f"and was evicted (the server keeps {self.max_samplers} samplers in memory: "
                "raise --max-samplers, or sample from saved weights)"
            )
        if spec.ref is not None:
            built = self.service.create_sampling_client(
                model_path=str(spec.ref.directory(self.checkpoint_root))
            ).result()
        else:
            built = self.service.create_sampling_client(base_model=spec.base_model).result()
        self._keep_sampler(sampler_id, built)
        return built

    def submit_sample(
        self,
        sampler_id: str,
        seq_id: int,
        run: Callable[[LocalSamplingClient], Coroutine[Any, Any, Reply]],
    ) -> str:
        """Runs `run(sampler)` on the worker loop (batched with concurrent samples)."""
        key = ("sample", sampler_id, seq_id) if seq_id >= 0 else None  # no seq_id: no dedupe
        request_id, new = self._new_pending("asample", key)
        if not new:
            return request_id

        async def go(future: concurrent.futures.Future[Reply]) -> None:
            try:
                reply = await run(self._sampler(sampler_id))
            except Exception as err:
                reply = failure_reply(err, "asample", self.public_message)
            future.set_result(reply)

        def job(future: concurrent.futures.Future[Reply]) -> None:
            self._sample_queue.append(lambda: go(future))
            self._arrivals.append(self._loop.time())
            if self._dispatcher is None:
                self._dispatcher = self._loop.create_task(self._dispatch_samples())

        return self._on_worker(request_id, job)

    async def _dispatch_samples(self) -> None:
        """Worker: starts the queued samples together once requests stop arriving.

        HTTP requests of one round (a `gather` of a batch's groups) arrive over a few
        milliseconds, with gaps that grow when the client is busy; started at once, the first
        would run alone and the rest after it. So the dispatcher waits until no new request
        came for 3x the longest gap between this round's arrivals (within `_GATHER_QUIET_S` and
        `_GATHER_QUIET_MAX_S`; at most `_GATHER_MAX_S` in all), then starts every queued
        request in one tick: the local sampling client's batcher serves them in one jitted
        call.
        """
        started = self._loop.time()
        seen = -1
        while seen != len(self._sample_queue) and self._loop.time() - started < _GATHER_MAX_S:
            seen = len(self._sample_queue)
            gaps = [b - a for a, b in itertools.pairwise(self._arrivals)]
            quiet = min(max(_GATHER_QUIET_S, 3 * max(gaps, default=0.0)), _GATHER_QUIET_MAX_S)
            await asyncio.sleep(quiet)
        queued, self._sample_queue = self._sample_queue, []
        self._arrivals = []
        self._dispatcher = None
        _logger.info(
            "sampling: %d requests started together after %.1f ms",
            len(queued),
            1000 * (self._loop.time() - started),
        )
        for start in queued:
            self._loop.create_task(start())

    def delete_expired_checkpoints(self) -> list[str]:
        """Deletes the checkpoints whose TTL has passed; returns their tinker paths."""
        deleted = []
        rest = self.service.create_rest_client()
        for ref in self.ttl.expired():
            directory = str(ref.directory(self.checkpoint_root))
            try:
                self.call(functools.partial(rest.delete_checkpoint_from_tinker_path, directory))
                deleted.append(ref.tinker_path)
                _logger.info("checkpoint %s expired and was deleted", ref.tinker_path)
            except (LookupError, ValueError, OSError) as err:  # already gone: nothing to keep
                _logger.info("checkpoint %s expired (%s)", ref.tinker_path, err)
            self.ttl.forget(ref)
        return deleted

    # -- lifecycle --

    def close(self, timeout_s: float = 30.0) -> None:
        """Refuses new work, finishes the running operation, fails the queued ones."""
        with self._lock:
            first = not self._closed
            self._closed = True
            pending = [p.future for p in self._futures.values()]
        if not first:  # another thread is closing: wait until it is done
            self._close_done.wait(timeout_s)
            return
        done = threading.Event()

        def fail_waiting() -> None:
            for slot in self._slots.values():
                for _, future, what in slot.waiting.values():
                    if not future.done():
                        future.set_result(_shut_down(what))
                slot.waiting.clear()
            done.set()

        self._loop.call_soon_threadsafe(fail_waiting)
        done.wait(timeout_s)  # runs after the operation in progress
        for future in pending:
            if not future.done():
                future.set_result(_shut_down("request"))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
        self._close_done.set()

    @property
    def closed(self) -> bool:
        return self._closed


def _shut_down(what: str) -> Reply:
    """The failed result of work the server did not run before it stopped."""
    return json_reply(
        {"error": f"{what}: the server shut down before this ran", "category": "server"}
    )
