"""A run's files over a byte-level storage: local paths and `file://` URIs.

`storage_from_uri(log_path)` → `LocalStorage`; `TrainingRunStore` reads and writes a run's
`config.json`, `metrics.jsonl`, `timing_spans.jsonl`, `checkpoints.jsonl`, iteration folders
and `code.diff` in tinker-cookbook 0.6.1's on-disk form; `RunRegistry` finds the runs of a
folder. Cloud URIs are refused where used, naming the backend package they would need.
"""

from shell.storage._backends import (
    CLOUD_BACKENDS,
    AsyncStorage,
    FsspecStorage,
    LocalStorage,
    Storage,
    StorageStat,
    storage_from_uri,
    storage_join,
)
from shell.storage._incremental import IncrementalReader
from shell.storage._registry import RunInfo, RunRegistry, discover_runs
from shell.storage._run_store import IterationInfo, TrainingRunStore, iteration_dir

__all__ = [
    "CLOUD_BACKENDS",
    "AsyncStorage",
    "FsspecStorage",
    "IncrementalReader",
    "IterationInfo",
    "LocalStorage",
    "RunInfo",
    "RunRegistry",
    "Storage",
    "StorageStat",
    "TrainingRunStore",
    "discover_runs",
    "iteration_dir",
    "storage_from_uri",
    "storage_join",
]
