"""A Chrome / Perfetto trace of named spans, one JSON event per line.

The format is tinker-cookbook 0.6.1's `utils/trace` (`trace_init`): open it in
`https://ui.perfetto.dev/` or `chrome://tracing` after `trace_json_from_jsonl` made it a JSON
array.

Conventions:
- A span is a begin event (`"ph": "B"`) and an end event (`"E"`) with the same `name`, `pid`
  and `tid`; `ts` is `time.perf_counter()` in microseconds; `cat` is `"async"`.
- `pid` is a small number per OS thread (0 for the first thread that traced); `tid` is a track
  per asyncio task (its name) or, outside a task, per thread (`sync:<thread name>`), numbered
  `hash(track name) % 1_000_000`. Their begin and end events' `args` hold the `track` and
  `thread` names; the end event's `args` also hold the attributes the span's code added
  (`current_attributes`; a span without attributes of its own leaves them to the enclosing one).
- Each track and thread is named once by metadata events (`"ph": "M"`, `thread_name` /
  `process_name`), written right after its first begin event.
- Events are written as they happen, under a lock, to a file opened for appending (a resumed
  run adds to its trace); `stop_tracing` closes it. Tracing is per process: `start_tracing`
  replaces the current trace.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import IO, Any

__all__ = [
    "TRACE_EVENTS_FILE",
    "TraceWriter",
    "active_trace",
    "current_attributes",
    "start_tracing",
    "stop_tracing",
    "trace_json_from_jsonl",
    "traced",
]

TRACE_EVENTS_FILE = "trace_events.jsonl"
"""The trace a training run writes in its log dir (`TrainConfig.enable_trace`), the cookbook's
name."""


class TraceWriter:
    """Writes the trace events of one process to a JSONL file (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()
        self._pids: dict[int, int] = {}
        self._named: set[tuple[int, int]] = set()

    def _write(self, event: Mapping[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(event) + "\n")

    def begin(self, name: str) -> dict[str, Any]:
        """Writes a span's begin event (and its track's metadata, once); returns what its
        `end` needs."""
        thread = threading.current_thread()
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no running event loop
            task = None
        track = task.get_name() if task is not None else f"sync:{thread.name}"
        tid = hash(track) % 1_000_000
        args = {"track": track, "thread": thread.name}
        with self._lock:
            pid = self._pids.setdefault(thread.ident or 0, len(self._pids))
            self._write(
                {"name": name, "ph": "B", "pid": pid, "tid": tid,
                 "ts": time.perf_counter() * 1e6, "args": args, "cat": "async"}
            )  # fmt: skip
            for key, meta, label in ((tid, "thread_name", track), (0, "process_name", None)):
                if (pid, key) not in self._named:
                    self._named.add((pid, key))
                    self._write(
                        {"name": meta, "ph": "M", "pid": pid, "tid": key, "ts": 0,
                         "args": {"name": label or f"{thread.name} Thread"}}
                    )  # fmt: skip
        return {"name": name, "pid": pid, "tid": tid, "args": args}

    def end(self, opened: Mapping[str, Any], attributes: Mapping[str, Any]) -> None:
        """Writes the end event of the span `begin` opened, with `attributes` in its args."""
        event = {
            "name": opened["name"],
            "ph": "E",
            "pid": opened["pid"],
            "tid": opened["tid"],
            "ts": time.perf_counter() * 1e6,
            "args": {**opened["args"], **attributes},
            "cat": "async",
        }
        with self._lock:
            self._write(event)

    def close(self) -> None:
        """Flushes and closes the file (later events are dropped)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


_active: TraceWriter | None = None
_attributes: ContextVar[dict[str, Any] | None] = ContextVar("shell_trace_attributes", default=None)


def start_tracing(path: str | os.PathLike[str]) -> TraceWriter:
    """Traces the spans of this process into `path` from now on (closing a previous trace)."""
    global _active
    stop_tracing()
    _active = TraceWriter(path)
    return _active


def stop_tracing() -> None:
    """Closes the current trace, if any."""
    global _active
    writer, _active = _active, None
    if writer is not None:
        writer.close()


def active_trace() -> TraceWriter | None:
    """The current trace, or None when the process is not tracing."""
    return _active


def current_attributes() -> dict[str, Any]:
    """The attributes of the innermost traced span (written with its end event); outside
    one, a fresh dict that goes nowhere."""
    found = _attributes.get()
    return found if found is not None else {}


@contextmanager
def traced(name: str, *, own_attributes: bool = True) -> Iterator[dict[str, Any]]:
    """Traces the block as a span `name` when the process is tracing.

    Args:
        name: the span's name.
        own_attributes: the span collects the attributes its code adds
            (`current_attributes`) and writes them with its end event; False leaves them to
            the enclosing span (the cookbook's inline `scope_span`, whose own are empty).

    Yields:
        The attributes the span writes with its end event.
    """
    writer = _active
    if writer is None:
        yield {}
        return
    attributes: dict[str, Any] = {}
    opened = writer.begin(name)
    token = _attributes.set(attributes) if own_attributes else None
    try:
        yield attributes
    finally:
        if token is not None:
            _attributes.reset(token)
        writer.end(opened, attributes)


def trace_json_from_jsonl(
    jsonl_path: str | os.PathLike[str], json_path: str | os.PathLike[str]
) -> None:
    """Writes the events of a JSONL trace as one JSON array (what the trace viewers load)."""
    with Path(jsonl_path).open(encoding="utf-8") as f:
        events = [json.loads(line) for line in f if line.strip()]
    Path(json_path).write_text(json.dumps(events), encoding="utf-8")
