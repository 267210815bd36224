"""The futures of queued requests: timeouts and short batch answers.

`QueuedFuture.result(timeout)` and `result_async(timeout)` honour `timeout` with the builtin
`TimeoutError`, as the SDK's futures do (a queued sample included), the response stays
available after a timeout, and a batch `run` that answers too few requests fails them instead
of leaving them pending forever.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from pathlib import Path

import pytest
from tinker import types

from rlpure.model import ByteTokenizer
from shell.local._futures import Batched, QueuedFuture, ReadyFuture, TickBatcher
from tests.local.micro import (
    MICRO_NAME,
    micro_service,
)


class _ScriptedRun:
    """A batch `run` that answers `f"done:{request}"` after `delay` seconds, counting calls."""

    def __init__(self, delay: float = 0.0, drop: int = 0) -> None:
        self.delay = delay
        self.drop = drop  # answers this many requests too few
        self.batches: list[list[str]] = []

    def __call__(self, requests: list[str]) -> list[str]:
        self.batches.append(list(requests))
        time.sleep(self.delay)
        return [f"done:{r}" for r in requests][: len(requests) - self.drop]


def test_a_zero_or_negative_timeout_on_a_queued_request_raises_without_serving() -> None:
    async def scenario() -> None:
        run = _ScriptedRun()
        batcher: TickBatcher[str, str] = TickBatcher(asyncio.get_running_loop(), run)
        future = batcher.submit("a")
        for timeout in (0, -1.0):
            with pytest.raises(TimeoutError, match="still queued"):
                future.result(timeout=timeout)
        assert run.batches == []
        assert await future == "done:a"  # served by the next tick as usual
        assert future.result(timeout=0) == "done:a"  # a served request ignores the timeout
        assert run.batches == [["a"]]

    asyncio.run(scenario())


def test_a_batch_slower_than_the_timeout_raises_and_keeps_the_response() -> None:
    async def scenario() -> None:
        run = _ScriptedRun(delay=0.05)
        batcher: TickBatcher[str, str] = TickBatcher(asyncio.get_running_loop(), run)
        first, second = batcher.submit("a"), batcher.submit("b")
        with pytest.raises(TimeoutError, match=r"over timeout=0\.01") as info:
            first.result(timeout=0.01)
        assert isinstance(info.value, concurrent.futures.TimeoutError)  # what the SDK raises
        assert first.result() == "done:a" and second.result(timeout=0.01) == "done:b"
        assert run.batches == [["a", "b"]]  # served once, together
        third = batcher.submit("c")
        assert third.result(timeout=60) == "done:c"

    asyncio.run(scenario())


def test_result_async_honours_its_timeout() -> None:
    async def scenario() -> None:
        run = _ScriptedRun()
        batcher: TickBatcher[str, str] = TickBatcher(asyncio.get_running_loop(), run)
        future = batcher.submit("a")
        with pytest.raises(TimeoutError):
            await future.result_async(timeout=0)
        assert await future.result_async(timeout=60) == "done:a"

    asyncio.run(scenario())


def test_a_queued_sample_honours_the_timeout(tmp_path: Path) -> None:
    sampler = micro_service(tmp_path).create_sampling_client(base_model=MICRO_NAME).result()
    prompt = types.ModelInput.from_ints(ByteTokenizer().encode("hi"))
    params = types.SamplingParams(max_tokens=4, seed=1, stop=[])

    async def scenario() -> types.SampleResponse:
        future = sampler.sample(prompt, 2, params)
        assert isinstance(future, QueuedFuture)
        with pytest.raises(TimeoutError):
            future.result(timeout=0)
        return await future

    response = asyncio.run(scenario())
    expected = sampler.sample(prompt, 2, params).result(timeout=0)  # ready: no loop running
    assert [s.tokens for s in response.sequences] == [s.tokens for s in expected.sequences]


def test_a_run_answering_too_few_requests_fails_them_instead_of_hanging() -> None:
    async def scenario() -> None:
        batcher: TickBatcher[str, str] = TickBatcher(
            asyncio.get_running_loop(), _ScriptedRun(drop=1)
        )
        futures = [batcher.submit("a"), batcher.submit("b")]
        for future in futures:
            with pytest.raises(ValueError, match="returned 1 responses for 2 requests"):
                await asyncio.wait_for(future.result_async(), timeout=5)

    asyncio.run(scenario())


def test_batched_serves_at_once_outside_a_loop_and_per_tick_inside_one() -> None:
    runs: list[list[int]] = []

    def run(requests: list[int]) -> list[int]:
        runs.append(requests)
        return [2 * r for r in requests]

    batched = Batched(run)
    ready = batched.submit(1)
    assert isinstance(ready, ReadyFuture) and ready.result() == 2 and runs == [[1]]

    async def tick() -> list[int]:
        futures = [batched.submit(r) for r in (3, 4, 5)]
        return [await f.result_async() for f in futures]

    assert asyncio.run(tick()) == [6, 8, 10]
    assert asyncio.run(tick()) == [6, 8, 10]  # a new loop: a new queue, not the closed one's
    assert runs == [[1], [3, 4, 5], [3, 4, 5]]
