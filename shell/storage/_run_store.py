"""`TrainingRunStore`: typed reads and writes of one run's files, over any `Storage`.

The files and their on-disk form are tinker-cookbook 0.6.1's, so either side reads what the
other wrote:
- `config.json`: `json.dumps(config, indent=2)`, overwritten.
- `metrics.jsonl`, `timing_spans.jsonl`, `checkpoints.jsonl`: one `json.dumps(record)` line per
  append (metrics `{"step": step, **metrics}`; spans `{"step": step, "spans": [...]}`).
- `iteration_<NNNNNN>/<base>_rollout_summaries.jsonl` (overwritten) and
  `iteration_<NNNNNN>/<base>_logtree.json`; `code.diff`.
- `metrics.jsonl.pre_resume_<NNNNNN>`: the whole metrics file as it was before
  `truncate_metrics` dropped rows.
Reads are lenient: a missing file reads as None or `[]`, a damaged JSON file as None and a
damaged JSONL line is skipped, each with a warning. The store pickles while its readers are
unbuilt (they are built on first use).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shell.storage._backends import Storage, storage_join
from shell.storage._incremental import IncrementalReader

__all__ = ["IterationInfo", "TrainingRunStore", "iteration_dir"]

logger = logging.getLogger(__name__)

ITERATION_DIR = re.compile(r"^iteration_(\d+)$")
"""An iteration folder's name; the group is its number."""


def iteration_dir(iteration: int) -> str:
    """`iteration_000042` for 42."""
    return f"iteration_{iteration:06d}"


@dataclass
class IterationInfo:
    """What one iteration folder holds.

    A mutable dataclass, as the cookbook's (its callers build it field by field).
    """

    iteration: int
    has_train_rollouts: bool = False
    has_train_logtree: bool = False
    eval_labels: list[str] = field(default_factory=list)


def _rollout_file(base_name: str) -> str:
    return f"{base_name}_rollout_summaries.jsonl"


class TrainingRunStore:
    """Reads and writes one run's files under `prefix` of `storage`.

    Args:
        storage: the run's storage (`storage_from_uri(log_path)`).
        prefix: the run's folder inside `storage` (`""`: its root).
    """

    def __init__(self, storage: Storage, prefix: str = "") -> None:
        self.storage = storage
        self.prefix = prefix
        self._metrics: IncrementalReader | None = None
        self._timing: IncrementalReader | None = None
        self._config_read = False
        self._config: dict[str, Any] | None = None
        self._rollout_cache: dict[str, list[dict[str, Any]]] = {}

    def url(self, path: str = "") -> str:
        """The URI of `path` inside the run."""
        return self.storage.url(self._path(path))

    def _path(self, *parts: str) -> str:
        return storage_join(self.prefix, *parts)

    def _read_json(self, *parts: str) -> dict[str, Any] | None:
        try:
            loaded: dict[str, Any] | None = json.loads(self.storage.read(self._path(*parts)))
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, OSError) as error:
            logger.warning("Failed to read JSON %s: %s", self._path(*parts), error)
            return None
        return loaded

    def _read_jsonl(self, *parts: str) -> list[dict[str, Any]]:
        try:
            data = self.storage.read(self._path(*parts))
        except FileNotFoundError:
            return []
        except OSError as error:
            logger.warning("Failed to read JSONL %s: %s", self._path(*parts), error)
            return []
        records: list[dict[str, Any]] = []
        for line in data.decode("utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                logger.warning("Skipping malformed line in %s", self._path(*parts))
        return records

    def read_jsonl_typed(
        self, from_dict: Callable[[dict[str, Any]], Any], *parts: str
    ) -> list[Any]:
        """The JSONL file's records through `from_dict`; records it rejects are skipped."""
        records = []
        for record in self._read_jsonl(*parts):
            try:
                records.append(from_dict(record))
            except (KeyError, TypeError, ValueError) as error:
                logger.warning("Skipping corrupted record in %s: %s", self._path(*parts), error)
        return records

    def read_config(self) -> dict[str, Any] | None:
        """`config.json` (read once, then cached), None when missing or damaged."""
        if not self._config_read:
            self._config = self._read_json("config.json")
            self._config_read = True
        return self._config

    def _metrics_reader(self) -> IncrementalReader:
        if self._metrics is None:
            self._metrics = IncrementalReader(self.storage, self._path("metrics.jsonl"))
        return self._metrics

    def read_metrics(self) -> list[dict[str, Any]]:
        """Every metrics row (reading only what was appended since the last read)."""
        reader = self._metrics_reader()
        reader.read()
        return reader.records

    def read_new_metrics(self) -> list[dict[str, Any]]:
        """The metrics rows appended since the last read."""
        return self._metrics_reader().read()

    def metric_keys(self) -> set[str]:
        """Every metric name read so far (`step` excepted)."""
        return self._metrics_reader().known_keys

    def read_rollouts(self, iteration: int, base_name: str = "train") -> list[dict[str, Any]]:
        """The rollout summaries of an iteration (`base_name`: `train`, `eval_<label>`)."""
        filename = _rollout_file(base_name)
        key = f"{iteration}/{filename}"
        if key not in self._rollout_cache:
            self._rollout_cache[key] = self._read_jsonl(iteration_dir(iteration), filename)
        return self._rollout_cache[key]

    def read_single_rollout(
        self, iteration: int, group_idx: int, traj_idx: int, base_name: str = "train"
    ) -> dict[str, Any] | None:
        """The summary of one trajectory (by group and trajectory index), or None."""
        for record in self.read_rollouts(iteration, base_name):
            if record.get("group_idx") == group_idx and record.get("traj_idx") == traj_idx:
                return record
        return None

    def read_checkpoints(self) -> list[dict[str, Any]]:
        """The rows of `checkpoints.jsonl`."""
        return self._read_jsonl("checkpoints.jsonl")

    def _timing_reader(self) -> IncrementalReader:
        if self._timing is None:
            self._timing = IncrementalReader(self.storage, self._path("timing_spans.jsonl"))
        return self._timing

    def read_timing(self) -> list[dict[str, Any]]:
        """Every `timing_spans.jsonl` row (reading only what is new)."""
        reader = self._timing_reader()
        reader.read()
        return reader.records

    def read_logtree(self, iteration: int, base_name: str = "train") -> dict[str, Any] | None:
        """An iteration's `<base_name>_logtree.json`, or None."""
        return self._read_json(iteration_dir(iteration), f"{base_name}_logtree.json")

    def list_logtrees(self, iteration: int) -> list[str]:
        """The base names of an iteration's logtree files, sorted."""
        names = self.storage.list_dir(self._path(iteration_dir(iteration)))
        suffix = "_logtree.json"
        return sorted(name[: -len(suffix)] for name in names if name.endswith(suffix))

    def list_iterations(self) -> list[IterationInfo]:
        """Every iteration folder of the run, by number, with what it holds."""
        found: list[IterationInfo] = []
        for child in self.storage.list_dir(self._path()):
            match = ITERATION_DIR.match(child)
            if match is None:
                continue
            info = IterationInfo(iteration=int(match.group(1)))
            for name in self.storage.list_dir(self._path(child)):
                if name == "train_rollout_summaries.jsonl":
                    info.has_train_rollouts = True
                elif name == "train_logtree.json":
                    info.has_train_logtree = True
                elif name.startswith("eval_") and name.endswith("_rollout_summaries.jsonl"):
                    info.eval_labels.append(name[len("eval_") : -len("_rollout_summaries.jsonl")])
            found.append(info)
        return sorted(found, key=lambda info: info.iteration)

    def _write_json(self, data: dict[str, Any], *parts: str) -> None:
        self.storage.write(self._path(*parts), json.dumps(data, indent=2).encode("utf-8"))

    def _append_jsonl(self, record: dict[str, Any], *parts: str) -> None:
        self.storage.append(self._path(*parts), (json.dumps(record) + "\n").encode("utf-8"))

    def write_config(self, config: dict[str, Any]) -> None:
        """Writes `config.json` (and caches it)."""
        self._write_json(config, "config.json")
        self._config, self._config_read = config, True

    def write_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Appends `{"step": step, **metrics}` (just `metrics` without a step)."""
        record: dict[str, Any] = {} if step is None else {"step": step}
        record.update(metrics)
        self._append_jsonl(record, "metrics.jsonl")

    def truncate_metrics(self, from_step: int) -> int:
        """Drops the metrics rows whose integer `step` is >= `from_step` (a resume's).

        The file as it was is first written to `metrics.jsonl.pre_resume_<from_step:06d>`
        (only when a row is dropped). Rows without an integer step, and lines that are not
        JSON objects, are kept.

        Returns:
            The number of rows dropped.
        """
        path = self._path("metrics.jsonl")
        if not self.storage.exists(path):
            return 0
        raw = self.storage.read(path)
        kept: list[bytes] = []
        for line in raw.splitlines(keepends=True):
            if not _step_at_least(line, from_step):
                kept.append(line if line.endswith(b"\n") else line + b"\n")
        dropped = len(raw.splitlines()) - len(kept)
        if dropped == 0:
            return 0
        self.storage.write(self._path(f"metrics.jsonl.pre_resume_{from_step:06d}"), raw)
        self.storage.write(path, b"".join(kept))
        self._metrics = None
        return dropped

    def write_timing_spans(self, step: int, spans: list[dict[str, Any]]) -> None:
        """Appends `{"step": step, "spans": spans}` (nothing when `spans` is empty)."""
        if spans:
            self._append_jsonl({"step": step, "spans": spans}, "timing_spans.jsonl")

    def write_checkpoint(self, record: dict[str, Any]) -> None:
        """Appends one row to `checkpoints.jsonl`."""
        self._append_jsonl(record, "checkpoints.jsonl")

    def write_rollouts(
        self, iteration: int, records: list[dict[str, Any]], base_name: str = "train"
    ) -> None:
        """Writes an iteration's rollout summaries (replacing the file)."""
        filename = _rollout_file(base_name)
        lines = [json.dumps(record) for record in records]
        data = ("\n".join(lines) + "\n").encode("utf-8") if lines else b""
        self.storage.write(self._path(iteration_dir(iteration), filename), data)
        self._rollout_cache.pop(f"{iteration}/{filename}", None)

    def write_logtree(self, iteration: int, data: dict[str, Any], base_name: str = "train") -> None:
        """Writes an iteration's `<base_name>_logtree.json`."""
        self._write_json(data, iteration_dir(iteration), f"{base_name}_logtree.json")

    def write_code_diff(self, diff: str) -> None:
        """Writes `code.diff`."""
        self.storage.write(self._path("code.diff"), diff.encode("utf-8"))

    async def aread_config(self) -> dict[str, Any] | None:
        """`read_config` in a worker thread."""
        return await asyncio.to_thread(self.read_config)

    async def aread_metrics(self) -> list[dict[str, Any]]:
        """`read_metrics` in a worker thread."""
        return await asyncio.to_thread(self.read_metrics)

    async def aread_new_metrics(self) -> list[dict[str, Any]]:
        """`read_new_metrics` in a worker thread."""
        return await asyncio.to_thread(self.read_new_metrics)

    async def aread_rollouts(
        self, iteration: int, base_name: str = "train"
    ) -> list[dict[str, Any]]:
        """`read_rollouts` in a worker thread."""
        return await asyncio.to_thread(self.read_rollouts, iteration, base_name)

    async def aread_checkpoints(self) -> list[dict[str, Any]]:
        """`read_checkpoints` in a worker thread."""
        return await asyncio.to_thread(self.read_checkpoints)

    async def aread_timing(self) -> list[dict[str, Any]]:
        """`read_timing` in a worker thread."""
        return await asyncio.to_thread(self.read_timing)

    async def aread_logtree(
        self, iteration: int, base_name: str = "train"
    ) -> dict[str, Any] | None:
        """`read_logtree` in a worker thread."""
        return await asyncio.to_thread(self.read_logtree, iteration, base_name)

    async def awrite_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """`write_metrics` in a worker thread."""
        await asyncio.to_thread(self.write_metrics, metrics, step)

    async def awrite_checkpoint(self, record: dict[str, Any]) -> None:
        """`write_checkpoint` in a worker thread."""
        await asyncio.to_thread(self.write_checkpoint, record)


def _step_at_least(line: bytes, from_step: int) -> bool:
    """Whether a metrics line is a JSON object whose integer `step` is >= `from_step`."""
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return False
    return isinstance(step, int) and step >= from_step
