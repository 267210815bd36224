"""`tinker_cookbook.utils.trace`: named spans, per-iteration timing, and a Perfetto trace.

The cookbook 0.6.1 names over the project's own rooms: an iteration's spans and their `time/*`
metrics are `shell.timing` (`trace_iteration` is its `step_timer`, `IterationWindow` wraps its
`StepTimer`, `scope` / `scope_span` time into it), the Perfetto trace (`trace_init`) is
`shell.trace_events`, and `save_gantt_chart_html` is `shell.plots.write_span_gantt_html`.

Deliberate differences: `trace_init` does not patch the tinker SDK's client classes (SDK calls
are traced where the code marks them with `scope`); trace events are written as they happen
(no background flusher, so `flush_interval_sec` is unused); the Gantt chart is a PNG inside
the HTML file (the cookbook's is a Plotly chart, drawn only when plotly is installed).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import inspect
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shell.plots import write_span_gantt_html
from shell.timing import SpanRecord, StepTimer, span, span_dicts, step_timer, timing_metrics
from shell.trace_events import (
    current_attributes,
    start_tracing,
    stop_tracing,
    trace_json_from_jsonl,
    traced,
)
from shell.training._logs import JsonlWriter

__all__ = [
    "IterationWindow",
    "ScopeContext",
    "SpanRecord",
    "convert_jsonl_to_json_main",
    "get_scope_context",
    "save_gantt_chart_html",
    "scope",
    "scope_span",
    "scope_span_sync",
    "trace_init",
    "trace_iteration",
    "trace_shutdown",
    "update_scope_context",
]


@dataclass
class ScopeContext:
    """The attributes of the current traced span (written with its end event)."""

    attributes: dict[str, Any] = field(default_factory=dict)


def get_scope_context() -> ScopeContext:
    """The current span's context; add to its `attributes` to annotate the span."""
    return ScopeContext(attributes=current_attributes())


def update_scope_context(values: dict[str, Any]) -> None:
    """Adds `values` to the current span's attributes."""
    current_attributes().update(values)


def trace_init(flush_interval_sec: float = 1.0, output_file: str = "trace_events.jsonl") -> None:
    """Traces every `scope` / `scope_span` of this process into `output_file` (JSONL)."""
    del flush_interval_sec  # events are written as they happen
    start_tracing(output_file)


def trace_shutdown() -> None:
    """Closes the trace."""
    stop_tracing()


def scope(func: Callable[..., Any]) -> Callable[..., Any]:
    """Times each call of `func` (sync or async) as a span named after it, into the current
    iteration and the trace."""
    name = func.__name__
    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            with span(name, trace=False), traced(name):
                return await func(*args, **kwargs)

        return async_wrapper

    @functools.wraps(func)
    def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
        with span(name, trace=False), traced(name):
            return func(*args, **kwargs)

    return sync_wrapper


@contextlib.asynccontextmanager
async def scope_span(name: str) -> AsyncIterator[None]:
    """Times the block as a span `name` (`async with`); attributes added inside go to the
    enclosing `scope`'s span."""
    with span(name):
        yield


@contextlib.contextmanager
def scope_span_sync(name: str) -> Iterator[None]:
    """Times the block as a span `name` (`with`); attributes added inside go to the enclosing
    `scope`'s span."""
    with span(name):
        yield


class IterationWindow:
    """The spans of one training iteration (`trace_iteration` yields one)."""

    def __init__(self, timer: StepTimer | None = None) -> None:
        self._timer = StepTimer() if timer is None else timer

    @property
    def spans(self) -> list[SpanRecord]:
        """The spans recorded so far, in the order they ended."""
        return list(self._timer.spans)

    def record_span(self, name: str, start_time: float, end_time: float) -> None:
        """Records a span timed by hand (`time.perf_counter()` values)."""
        now, wall = time.perf_counter(), time.time()
        self._timer.add(
            [
                SpanRecord(
                    name=name,
                    start_time=start_time,
                    end_time=end_time,
                    wall_start=wall - (now - start_time),
                    wall_end=wall - (now - end_time),
                )
            ]
        )

    def merge_spans(self, spans: list[SpanRecord]) -> None:
        """Adds spans recorded elsewhere (a worker process's)."""
        self._timer.add(spans)

    def aggregate(self) -> dict[str, float]:
        """The spans' `time/*` metrics, without `time/total`."""
        return timing_metrics(self._timer.spans)

    def get_timing_metrics(self) -> dict[str, float]:
        """The spans' `time/*` metrics and, once the iteration ended, `time/total`."""
        return self._timer.metrics()

    def get_span_records(self) -> list[dict[str, Any]]:
        """`task`, `start`, `end` per span, as datetimes from 2000-01-01 plus the seconds since
        the first span (for Plotly timelines)."""
        spans = self._timer.spans
        if not spans:
            return []
        origin = min(s.wall_start for s in spans)
        epoch = datetime.datetime(2000, 1, 1)
        return [
            {
                "task": s.name,
                "start": epoch + datetime.timedelta(seconds=s.wall_start - origin),
                "end": epoch + datetime.timedelta(seconds=s.wall_end - origin),
            }
            for s in spans
        ]

    def get_span_dicts(self) -> list[dict[str, Any]]:
        """The spans as `timing_spans.jsonl` holds them (`name`, `duration`, relative walls)."""
        return span_dicts(self._timer.spans)

    def write_spans_jsonl(self, path: Path | str, step: int) -> None:
        """Appends `{"step": step, "spans": [...]}` to `path` (nothing without spans)."""
        dicts = self.get_span_dicts()
        if dicts:
            with JsonlWriter(path) as writer:
                writer.write({"step": step, "spans": dicts})

    def save_timing(self, step: int, *, store: Any) -> None:
        """Hands the spans to the cookbook's `store.write_timing_spans` (None: nothing)."""
        if store is not None:
            store.write_timing_spans(step, self.get_span_dicts())


@contextlib.contextmanager
def trace_iteration(step: int) -> Iterator[IterationWindow]:
    """Collects the spans of the block (an iteration) into the yielded window; its
    `get_timing_metrics()` after the block includes `time/total`."""
    del step  # the window does not record it
    with step_timer() as timer:
        yield IterationWindow(timer)


def save_gantt_chart_html(window: IterationWindow, step: int, path: Path | str) -> None:
    """Writes an HTML page with the window's Gantt chart (nothing without spans)."""
    dicts = window.get_span_dicts()
    if dicts:
        write_span_gantt_html(step, dicts, path)


def convert_jsonl_to_json_main() -> None:
    """Command line: `trace_events_jsonl_file output_json_file` → a JSON array for the trace
    viewers (`python -m shell.cookbook.utils.trace`); a file it cannot read, parse or write is
    one line and exit status 1 (the cookbook's raises)."""
    parser = argparse.ArgumentParser(
        description="Convert trace events from JSONL format to JSON format for visualization "
        "in chrome://tracing or https://ui.perfetto.dev/"
    )
    parser.add_argument("trace_events_jsonl_file", type=str)
    parser.add_argument("output_json_file", type=str)
    args = parser.parse_args()
    try:
        trace_json_from_jsonl(args.trace_events_jsonl_file, args.output_json_file)
    except (OSError, ValueError) as error:  # unreadable, unwritable, or not JSON lines
        raise SystemExit(f"convert: {args.trace_events_jsonl_file}: {error}") from None
    print(
        "To view the trace:\n1. Navigate to chrome://tracing or https://ui.perfetto.dev/\n"
        f"2. Load the trace file: {args.output_json_file}"
    )


if __name__ == "__main__":
    convert_jsonl_to_json_main()
