"""`IncrementalReader`: reads an append-only JSONL file by byte offset, new lines only.

Conventions:
- Only whole lines are parsed: bytes after the last newline (a line being appended) wait for
  the next `read`. Blank lines are skipped, malformed ones skipped with a warning.
- At most `max_records` records are kept in memory (the oldest dropped); `total_read` counts
  them all. One lock guards every mutation (readers may share one across threads); the reader
  pickles without its lock.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any

from shell.storage._backends import Storage

__all__ = ["IncrementalReader"]

logger = logging.getLogger(__name__)

MAX_RECORDS = 50_000
"""The cookbook's default cap on buffered records."""


class IncrementalReader:
    """Reads new whole lines of one JSONL file of a storage on each `read`.

    Args:
        storage: where the file lives.
        path: the file's path in `storage`.
        max_records: most records kept in `records` (the oldest dropped first).
    """

    def __init__(self, storage: Storage, path: str, max_records: int = MAX_RECORDS) -> None:
        self._storage = storage
        self._path = path
        self._max_records = max_records
        self._offset = 0
        self._records: list[dict[str, Any]] = []
        self._known_keys: set[str] = set()
        self._total_read = 0
        self._lock = threading.Lock()

    @property
    def records(self) -> list[dict[str, Any]]:
        """A copy of the buffered records (at most `max_records`)."""
        with self._lock:
            return list(self._records)

    @property
    def total_read(self) -> int:
        """Records read since creation (not capped)."""
        with self._lock:
            return self._total_read

    @property
    def known_keys(self) -> set[str]:
        """Every key seen in a record, `step` excepted."""
        with self._lock:
            return set(self._known_keys)

    def read(self) -> list[dict[str, Any]]:
        """The records of the whole lines added since the last call."""
        with self._lock:
            return self._read_locked()

    def _read_locked(self) -> list[dict[str, Any]]:
        found = self._storage.stat(self._path)
        if found is None or found.size <= self._offset:
            return []
        try:
            fresh = self._storage.read_range(self._path, self._offset)
        except FileNotFoundError:
            return []
        fresh = fresh[: fresh.rfind(b"\n") + 1]
        if not fresh:
            return []
        self._offset += len(fresh)
        new_records = [r for line in fresh.decode("utf-8", errors="replace").splitlines()
                       if (r := _parsed(line)) is not None]  # fmt: skip
        for record in new_records:
            self._known_keys.update(key for key in record if key != "step")
        self._records.extend(new_records)
        self._total_read += len(new_records)
        if len(self._records) > self._max_records:
            self._records = self._records[-self._max_records :]
        return new_records

    async def aread(self) -> list[dict[str, Any]]:
        """`read` in a worker thread."""
        return await asyncio.to_thread(self.read)

    def has_data(self) -> bool:
        """Whether records are buffered or the file holds any bytes."""
        with self._lock:
            if self._records:
                return True
            found = self._storage.stat(self._path)
            return found is not None and found.size > 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


def _parsed(line: str) -> Any:
    """The JSON value of a non-blank line; None (with a warning) for a malformed one."""
    line = line.strip()
    if not line:
        return None
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        logger.warning("Skipping malformed JSONL line: %s", line[:100])
        return None
