"""`tinker_cookbook.stores.storage`: re-exported from `shell.storage`.

Deliberate difference: a cloud URI (`s3://`, `gs://`, `az://`, ...) raises `ConfigError` in
`storage_from_uri` (the cookbook serves it through fsspec), and `FsspecStorage` raises it when
built; the line names the backend package it would need.
"""

from shell.storage import (
    AsyncStorage,
    FsspecStorage,
    LocalStorage,
    Storage,
    StorageStat,
    storage_from_uri,
    storage_join,
)

__all__ = [
    "AsyncStorage",
    "FsspecStorage",
    "LocalStorage",
    "Storage",
    "StorageStat",
    "storage_from_uri",
    "storage_join",
]
