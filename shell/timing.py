"""Phase timing of a training step: spans, their `time/*` metrics and `timing_spans.jsonl`.

The cookbook 0.6.1's `utils/trace.py` (`trace_iteration`, `scope`, `scope_span`,
`IterationWindow`) is the spec; this is our own small version of its iteration window.

Conventions:
- A span is a named, timed block (`SpanRecord`): `start_time` / `end_time` from
  `time.perf_counter` (durations; process-local), `wall_start` / `wall_end` from `time.time`
  (placing spans on a timeline), all in seconds.
- A `StepTimer` collects the spans of one step. `step_timer()` makes one the current timer of
  the running context (a `ContextVar`, so the asyncio tasks a step gathers record into it as
  well) and measures the whole block as the step's total; `span(name)` times a block into the
  current timer, and does nothing outside one, so library code can mark its phases without
  taking a timer argument; while a Perfetto trace is open (`shell.trace_events`, a run's
  `enable_trace`) it also writes the block there, timer or not.
- Metrics (`timing_metrics`, the cookbook's `IterationWindow.get_timing_metrics`): a name seen
  once gives `time/<name>` (seconds); a name seen `n > 1` times gives `time/<name>:total`,
  `:count`, `:mean` and `:max`; the whole block is `time/total`.
- `timing_spans.jsonl` (`TIMING_SPANS_FILE`) holds one JSON object per step, the cookbook's
  schema: `{"step": i, "spans": [{"name", "duration", "wall_start", "wall_end"}, ...]}`, wall
  times in seconds relative to the step's earliest span, spans in the order they ended. A
  step without spans writes no line.
- Span names are the cookbook's where it times the same phase (see `shell.training._loop`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import msgspec

from shell.trace_events import active_trace, traced

__all__ = [
    "MATMUL_N",
    "TIMING_SPANS_FILE",
    "SpanRecord",
    "StepTimer",
    "matmul_gflops",
    "matmul_seconds",
    "recording",
    "span",
    "span_dicts",
    "step_timer",
    "timing_metrics",
]

TIMING_SPANS_FILE = "timing_spans.jsonl"
"""One JSON object of phase spans per step, in the log dir."""


class SpanRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One timed block.

    Attributes:
        name: the phase (e.g. `sampling`, `train_step`).
        start_time: `time.perf_counter()` at the start, seconds.
        end_time: `time.perf_counter()` at the end, seconds.
        wall_start: `time.time()` at the start, seconds since the epoch.
        wall_end: `time.time()` at the end, seconds since the epoch.
    """

    name: str
    start_time: float
    end_time: float
    wall_start: float
    wall_end: float

    @property
    def duration(self) -> float:
        """Seconds from start to end."""
        return self.end_time - self.start_time


class StepTimer:
    """The spans of one step, in the order they ended (shell-side, mutable by design).

    Args:
        clock: the duration clock (default `time.perf_counter`).
        wall_clock: the timeline clock (default `time.time`).
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.perf_counter,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self._wall_clock = wall_clock
        self._spans: list[SpanRecord] = []
        self.total: float | None = None
        """Seconds the `step_timer` block took (None while it runs)."""

    @property
    def spans(self) -> tuple[SpanRecord, ...]:
        """The spans recorded so far."""
        return tuple(self._spans)

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        """Times the block as a span `name` (recorded also when the block raises)."""
        start, wall_start = self._clock(), self._wall_clock()
        try:
            yield
        finally:
            self._spans.append(
                SpanRecord(
                    name=name,
                    start_time=start,
                    end_time=self._clock(),
                    wall_start=wall_start,
                    wall_end=self._wall_clock(),
                )
            )

    def add(self, records: Iterable[SpanRecord]) -> None:
        """Adds spans timed elsewhere (by hand, or in a worker process), after those recorded."""
        self._spans.extend(records)

    def metrics(self) -> dict[str, float]:
        """`timing_metrics` of the spans and the total."""
        return timing_metrics(self._spans, total=self.total)


_current: ContextVar[StepTimer | None] = ContextVar("shell_training_step_timer", default=None)


@contextmanager
def recording(timer: StepTimer) -> Iterator[StepTimer]:
    """Makes `timer` the current timer for the block (its `total` unchanged): for phases of a
    step that run after its timed block, e.g. its checkpoint."""
    token = _current.set(timer)
    try:
        yield timer
    finally:
        _current.reset(token)


@contextmanager
def step_timer(timer: StepTimer | None = None) -> Iterator[StepTimer]:
    """Makes `timer` (default: a new one) the current timer for the block, and sets its
    `total` to the block's duration when the block ends (the cookbook's `trace_iteration`)."""
    timer = StepTimer() if timer is None else timer
    start = timer._clock()
    try:
        with recording(timer):
            yield timer
    finally:
        timer.total = timer._clock() - start


@contextmanager
def span(name: str, *, trace: bool = True) -> Iterator[None]:
    """Times the block as a span `name` of the current `step_timer` (nothing outside one) and,
    while a trace is open (`shell.trace_events.start_tracing`), records it there too, its
    attributes left to the enclosing traced span (the cookbook's `scope_span`). `trace=False`:
    the caller traces the block itself."""
    with contextlib.ExitStack() as stack:
        if trace and active_trace() is not None:
            stack.enter_context(traced(name, own_attributes=False))
        timer = _current.get()
        if timer is not None:
            stack.enter_context(timer.span(name))
        yield


def timing_metrics(spans: Sequence[SpanRecord], *, total: float | None = None) -> dict[str, float]:
    """The `time/*` metrics of a step's spans (see the module docstring).

    Examples:
        >>> s = [SpanRecord(name=n, start_time=0.0, end_time=d, wall_start=0.0, wall_end=d)
        ...      for n, d in (("sampling", 2.0), ("env_step", 1.0), ("env_step", 3.0))]
        >>> timing_metrics(s, total=5.0)  # doctest: +NORMALIZE_WHITESPACE
        {'time/sampling': 2.0, 'time/env_step:total': 4.0, 'time/env_step:count': 2,
         'time/env_step:mean': 2.0, 'time/env_step:max': 3.0, 'time/total': 5.0}
    """
    durations: dict[str, list[float]] = {}
    for record in spans:
        durations.setdefault(record.name, []).append(record.duration)
    out: dict[str, float] = {}
    for name, found in durations.items():
        if len(found) == 1:
            out[f"time/{name}"] = found[0]
        else:
            out[f"time/{name}:total"] = sum(found)
            out[f"time/{name}:count"] = len(found)
            out[f"time/{name}:mean"] = sum(found) / len(found)
            out[f"time/{name}:max"] = max(found)
    if total is not None:
        out["time/total"] = total
    return out


def span_dicts(spans: Sequence[SpanRecord]) -> list[dict[str, Any]]:
    """The spans as `timing_spans.jsonl` writes them: `name`, `duration`, and `wall_start` /
    `wall_end` relative to the earliest `wall_start` (empty input: empty list)."""
    if not spans:
        return []
    origin = min(record.wall_start for record in spans)
    return [
        {
            "name": record.name,
            "duration": record.duration,
            "wall_start": record.wall_start - origin,
            "wall_end": record.wall_end - origin,
        }
        for record in spans
    ]


MATMUL_N = 2048
"""The side of the square float32 `jnp.matmul` that `matmul_seconds` times."""


def matmul_seconds(n: int = MATMUL_N) -> float:
    """Seconds of one jitted `n³` float32 `jnp.matmul` here (best of 3 after a warm-up).

    The machine's speed right now, which benchmarks print beside their figures: these VMs
    differ by tens of percent, and load moves them more.
    """
    import jax  # here, not at import: the training loop imports this module
    import jax.numpy as jnp

    a = jnp.ones((n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    jax.block_until_ready(f(a))  # type: ignore[no-untyped-call]
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        jax.block_until_ready(f(a))  # type: ignore[no-untyped-call]
        best = min(best, time.perf_counter() - start)
    return best


def matmul_gflops(n: int = MATMUL_N) -> float:
    """The float32 matmul rate here in GFLOP/s (`2 n³` over `matmul_seconds(n)`)."""
    return 2 * n**3 / matmul_seconds(n) / 1e9
