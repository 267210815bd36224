"""How the local backend hands results back: ready futures and the per-tick micro-batcher.

Conventions:
- Local operations complete when called, so most results come back as a `ReadyFuture`: an
  already-resolved `tinker.APIFuture` (`await f`, `f.result()`, `await f.result_async()`,
  `f.future()` all give the value at once, whatever the `timeout`, as a done
  `concurrent.futures.Future` does).
- Client factories return a `ClientFuture`, which also forwards public attribute access to the
  client, as the SDK's back-compat client futures do.
- Inside a running event loop, requests may be queued on a `TickBatcher` instead: it flushes
  once an event-loop tick passes with no new request, on the loop's thread, so what lands in a
  batch depends only on the order coroutines run, never on wall time. A queued request's
  `QueuedFuture.result()` flushes the queue at once instead of deadlocking the loop.
  `Batched` picks between the two for a client's request.
- `timeout` (seconds, `None` = no limit) raises the builtin `TimeoutError`, as the SDK's
  futures do (`concurrent.futures.Future.result`, `asyncio.timeout`). A batch served by
  `result()` runs on the calling thread and cannot be pre-empted: `timeout <= 0` raises at once
  without serving it, and a batch that ran longer than `timeout` raises when it returns. The
  response stays on the future either way, so a later `result()` gives it (as the SDK's future
  keeps running after a timeout).
- A failure of the batch's `run` is set on every request of that batch; nothing here is
  thread-safe (one thread, typically the event loop's).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import tinker

__all__ = [
    "Batched",
    "ClientFuture",
    "QueuedFuture",
    "ReadyFuture",
    "TickBatcher",
    "running_loop",
]

T = TypeVar("T")
C = TypeVar("C")
R = TypeVar("R")


class ReadyFuture(tinker.APIFuture[T]):
    """An `APIFuture` whose outcome is already known (local ops complete when called).

    Both clients return one for every operation that completes when called.
    """

    def __init__(self, value: T) -> None:
        self._value = value

    def result(self, timeout: float | None = None) -> T:
        return self._value

    async def result_async(self, timeout: float | None = None) -> T:
        return self._value

    def future(self) -> concurrent.futures.Future[T]:
        out: concurrent.futures.Future[T] = concurrent.futures.Future()
        out.set_result(self._value)
        return out


class ClientFuture(ReadyFuture[C], Generic[C]):
    """A ready future of a client that also forwards attribute access to the client.

    Mirrors the SDK's `BackcompatTrainingClientFuture` / `BackcompatSamplingClientFuture`:
    `await f` or `f.result()` is the supported way; using `f` as the client still works.
    """

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._value, name)


class QueuedFuture(tinker.APIFuture[T]):
    """A request waiting in a `TickBatcher` queue."""

    def __init__(self, batcher: TickBatcher[Any, T], inner: asyncio.Future[T]) -> None:
        self._batcher = batcher
        self._inner = inner

    def result(self, timeout: float | None = None) -> T:
        """The response, serving the queue now (on this thread) if it has not been served.

        Raises:
            TimeoutError: `timeout` is `<= 0` and the request has not been served, or serving
                it took longer than `timeout` seconds (see the module docstring).
        """
        if not self._inner.done():
            if timeout is not None and timeout <= 0:
                raise TimeoutError(
                    f"QueuedFuture.result: timeout={timeout} and the request is still queued"
                )
            start = time.monotonic()
            self._batcher.flush()
            elapsed = time.monotonic() - start
            if timeout is not None and elapsed > timeout:
                raise TimeoutError(
                    f"QueuedFuture.result: serving the queued batch took {elapsed:.3f} s, over "
                    f"timeout={timeout} s (the response stays available)"
                )
        return self._inner.result()

    async def result_async(self, timeout: float | None = None) -> T:
        async with asyncio.timeout(timeout):
            return await asyncio.shield(self._inner)

    def future(self) -> concurrent.futures.Future[T]:
        out: concurrent.futures.Future[T] = concurrent.futures.Future()
        try:
            out.set_result(self.result())
        except Exception as err:
            out.set_exception(err)
        return out


class TickBatcher(Generic[R, T]):
    """Collects the requests of one event loop and serves them in one `run` call.

    The sampling client queues its `sample` requests here so that they share one jitted call.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        run: Callable[[list[R]], list[T]],
    ) -> None:
        self.loop = loop
        self._run = run
        self._pending: list[tuple[R, asyncio.Future[T]]] = []
        self._flush_task: asyncio.Task[None] | None = None

    def submit(self, request: R) -> QueuedFuture[T]:
        """Queues `request`; the flush runs once an event-loop tick passes with no new one."""
        inner: asyncio.Future[T] = self.loop.create_future()
        self._pending.append((request, inner))
        if self._flush_task is None:
            self._flush_task = self.loop.create_task(self._flush_when_settled())
        return QueuedFuture(self, inner)

    async def _flush_when_settled(self) -> None:
        seen = -1
        while seen != len(self._pending):
            seen = len(self._pending)
            await asyncio.sleep(0)
        self._flush_task = None
        self.flush()

    def flush(self) -> None:
        """Serves every queued request now (on the calling thread)."""
        pending, self._pending = self._pending, []
        live = [(req, fut) for req, fut in pending if not fut.done()]
        if not live:
            return
        try:
            responses = self._run([req for req, _ in live])
            if len(responses) != len(live):  # else the unanswered futures would never finish
                raise ValueError(
                    f"TickBatcher: run returned {len(responses)} responses for {len(live)} requests"
                )
        except Exception as err:
            for _, fut in live:
                if not fut.done():
                    fut.set_exception(err)
            return
        for (_, fut), response in zip(live, responses, strict=True):
            if not fut.done():
                fut.set_result(response)


class Batched(Generic[R, T]):
    """Serves requests with `run`: at once outside an event loop (a `ReadyFuture`), else queued
    on a `TickBatcher` of the running loop (a new one when the loop changed)."""

    def __init__(self, run: Callable[[list[R]], list[T]]) -> None:
        self._run = run
        self._batcher: TickBatcher[R, T] | None = None

    def submit(self, request: R) -> ReadyFuture[T] | QueuedFuture[T]:
        """`request`'s future (see the class docstring)."""
        loop = running_loop()
        if loop is None:
            return ReadyFuture(self._run([request])[0])
        if self._batcher is None or self._batcher.loop is not loop:
            self._batcher = TickBatcher(loop, self._run)
        return self._batcher.submit(request)


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running on this thread, or `None` outside one."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
