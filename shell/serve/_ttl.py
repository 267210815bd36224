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
import math
import os
import threading
import time
from pathlib import Path

from shell.serve._paths import CheckpointRef, PathError, parse_tinker_path

__all__ = ["MAX_TTL_S", "CheckpointTtl", "check_ttl"]


_LATEST = 253_402_300_799.0  # 9999-12-31T23:59:59Z, the last second `datetime` can hold
MAX_TTL_S = 100 * 365 * 86_400
"""The longest `ttl_seconds` accepted (a century; `None` means never expire)."""


def check_ttl(ttl_seconds: object) -> int | None:
    """`ttl_seconds` if it is `None` or an int in `[0, MAX_TTL_S]` (0: expired at once), else `ValueError`."""
    if ttl_seconds is None:
        return None
    if (
        isinstance(ttl_seconds, bool)
        or not isinstance(ttl_seconds, int)
        or not 0 <= ttl_seconds <= MAX_TTL_S
    ):
        raise ValueError(
            f"ttl_seconds: expected an int in [0, {MAX_TTL_S}] or null, got {ttl_seconds!r}"
        )
    return ttl_seconds


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
        table = {}
        for path, when in raw.items():
            if isinstance(when, (int, float)) and not isinstance(when, bool):
                try:
                    seconds = float(when)
                except OverflowError:
                    continue
                if math.isfinite(seconds) and 0 <= seconds <= _LATEST:
                    table[str(path)] = seconds
        return table

    def _write(self) -> None:
        self._file.parent.mkdir(parents=True, exist_ok=True)
        staging = self._file.with_name(f".ttl.json.{os.getpid()}.tmp")
        staging.write_text(json.dumps(self._table, sort_keys=True), encoding="utf-8")
        os.replace(staging, self._file)

    def set(self, ref: CheckpointRef, ttl_seconds: int | None) -> None:
        """`ref` expires `ttl_seconds` from now (`None`: never).

        Raises:
            ValueError: a `ttl_seconds` `check_ttl` refuses.
        """
        ttl_seconds = check_ttl(ttl_seconds)
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
        refs = []
        for path in due:
            try:
                refs.append(parse_tinker_path(path))
            except PathError:  # a hand-edited table: never delete what it does not name
                continue
        return refs
