"""`tinker_cookbook.stores`: a run's files over a storage, from `shell.storage`.

Local paths and `file://` URIs work fully, in the cookbook's on-disk form; cloud URIs
(`s3://`, `gs://`, `az://`) and `FsspecStorage` raise `ConfigError` where used, in one line
naming the fsspec backend they would need. `eval_store` is not ported.
"""

from shell.cookbook.stores._incremental import IncrementalReader
from shell.cookbook.stores.registry import RunInfo, RunRegistry
from shell.cookbook.stores.storage import (
    AsyncStorage,
    FsspecStorage,
    LocalStorage,
    Storage,
    StorageStat,
    storage_from_uri,
    storage_join,
)
from shell.cookbook.stores.training_store import TrainingRunStore

__all__ = [
    "AsyncStorage",
    "FsspecStorage",
    "IncrementalReader",
    "LocalStorage",
    "RunInfo",
    "RunRegistry",
    "Storage",
    "StorageStat",
    "TrainingRunStore",
    "storage_from_uri",
    "storage_join",
]
