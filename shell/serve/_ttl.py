"""Checkpoint expiry (`ttl_seconds`) for the server: one JSON file beside the checkpoints.

Conventions:
- `<state_dir>/checkpoints/ttl.json` maps a checkpoint's tinker path to when it expires
  (seconds since the epoch). It is rewritten atomically (a temporary file, then `os.replace`),
  so a crash leaves the old or the new table, never half of one; it survives restarts.
- A save with `ttl_seconds` or `PUT .../ttl` sets an entry; `ttl_seconds: null` removes it (the
  checkpoint then never expires, the default). The server's janitor deletes checkpoints past
  their time (`expired`), then `forget`s them.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from pathlib import Path

from shell.serve._paths import CheckpointRef, parse_tinker_path

__all__ = ["CheckpointTtl"]


class CheckpointTtl:
    """The expiry table of one state dir (thread-safe)."""

    def __init__(self, checkpoint_root: Path) -> None:
        self._file = checkpoint_root / "ttl.json"
        self._lock = threading.Lock()
        self._table = self._read()

    def _read(self) -> dict[str, float]:
        try:
            raw = json.loads(self._file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            return {}  # an unreadable table expires nothing (never deletes by mistake)
        if not isinstance(raw, dict):
            return {}
        return {
            str(path): float(when)
            for path, when in raw.items()
            if isinstance(when, (int, float)) and not isinstance(when, bool)
        }

    def _write(self) -> None:
        self._file.parent.mkdir(parents=True, exist_ok=True)
        staging = self._file.with_name(f".ttl.json.{os.getpid()}.tmp")
        staging.write_text(json.dumps(self._table, sort_keys=True), encoding="utf-8")
        os.replace(staging, self._file)

    def set(self, ref: CheckpointRef, ttl_seconds: int | None) -> None:
        """`ref` expires `ttl_seconds` from now (`None`: never)."""
        with self._lock:
            if ttl_seconds is None:
                if self._table.pop(ref.tinker_path, None) is None:
                    return
            else:
                self._table[ref.tinker_path] = time.time() + ttl_seconds
            self._write()

    def forget(self, ref: CheckpointRef) -> None:
        """Drops `ref`'s entry (it was deleted)."""
        self.set(ref, None)

    def expires_at(self, ref: CheckpointRef) -> dt.datetime | None:
        with self._lock:
            when = self._table.get(ref.tinker_path)
        return None if when is None else dt.datetime.fromtimestamp(when, tz=dt.UTC)

    def expired(self, now: float | None = None) -> list[CheckpointRef]:
        """The checkpoints whose time has come."""
        now = time.time() if now is None else now
        with self._lock:
            due = [path for path, when in self._table.items() if when <= now]
        return [parse_tinker_path(path) for path in due]
