"""Byte-level storage of a run's files: the `Storage` protocol, the local backend, URIs.

Conventions:
- Paths are relative POSIX strings (`"runs/001/metrics.jsonl"`), resolved against a backend's
  root; a path that resolves outside the root is refused (`ValueError`).
- `LocalStorage` writes whole files through a sibling temporary file and a rename (a reader
  never sees half a file) and appends in place; it is picklable (it holds only its root).
- Local paths and `file://` URIs are served; a cloud URI (`s3://`, `gs://`, `az://`, ...) is
  refused where it is used (`storage_from_uri`, `FsspecStorage(...)`) with one line naming the
  backend package it needs: this project runs no cloud storage backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import msgspec

from shell.errors import ConfigError

__all__ = [
    "CLOUD_BACKENDS",
    "AsyncStorage",
    "FsspecStorage",
    "LocalStorage",
    "Storage",
    "StorageStat",
    "storage_from_uri",
    "storage_join",
]

CLOUD_BACKENDS: dict[str, str] = {
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "az": "adlfs",
    "abfs": "adlfs",
    "abfss": "adlfs",
}
"""URI scheme → the fsspec backend package the cookbook would use for it."""


class StorageStat(msgspec.Struct, frozen=True):
    """A file's size in bytes and modification time (seconds since the epoch).

    Positional as well as keyword construction, as the cookbook's dataclass.
    """

    size: int
    mtime: float


@runtime_checkable
class Storage(Protocol):
    """Synchronous byte-level file IO under one root (the cookbook's `Storage`)."""

    def url(self, path: str = "") -> str: ...
    def read(self, path: str) -> bytes: ...
    def write(self, path: str, data: bytes) -> None: ...
    def append(self, path: str, data: bytes) -> None: ...
    def exists(self, path: str) -> bool: ...
    def stat(self, path: str) -> StorageStat | None: ...
    def read_range(self, path: str, offset: int, length: int | None = None) -> bytes: ...
    def list_dir(self, prefix: str) -> list[str]: ...
    def remove(self, path: str) -> None: ...
    def remove_dir(self, path: str) -> None: ...
    def flush(self) -> None: ...
    def __enter__(self) -> Storage: ...
    def __exit__(self, *exc: object) -> None: ...


@runtime_checkable
class AsyncStorage(Protocol):
    """The asynchronous twin of `Storage` (the cookbook's `AsyncStorage`)."""

    async def aread(self, path: str) -> bytes: ...
    async def awrite(self, path: str, data: bytes) -> None: ...
    async def aappend(self, path: str, data: bytes) -> None: ...
    async def aexists(self, path: str) -> bool: ...
    async def astat(self, path: str) -> StorageStat | None: ...
    async def aread_range(self, path: str, offset: int, length: int | None = None) -> bytes: ...
    async def alist_dir(self, prefix: str) -> list[str]: ...
    async def aremove(self, path: str) -> None: ...
    async def aremove_dir(self, path: str) -> None: ...
    async def __aenter__(self) -> AsyncStorage: ...
    async def __aexit__(self, *exc: object) -> None: ...


class LocalStorage:
    """Files under a local directory; both `Storage` and `AsyncStorage` (threads).

    Args:
        root: the directory (`~` expanded, made absolute).
        mkdir: create the directory now when it is missing.
    """

    def __init__(self, root: str | Path, *, mkdir: bool = True) -> None:
        self._root = Path(root).expanduser().resolve()
        if mkdir:
            self._root.mkdir(parents=True, exist_ok=True)

    @property
    def root(self) -> Path:
        """The resolved root directory."""
        return self._root

    def url(self, path: str = "") -> str:
        """The `file:///...` URI of `path` (of the root when empty)."""
        return (self._root / path if path else self._root).as_uri()

    def _resolve(self, path: str) -> Path:
        resolved = (self._root / path).resolve()
        if not resolved.is_relative_to(self._root):
            raise ValueError(f"Path escapes storage root: {path}")
        return resolved

    def read(self, path: str) -> bytes:
        """The whole file; `FileNotFoundError` when missing."""
        return self._resolve(path).read_bytes()

    def write(self, path: str, data: bytes) -> None:
        """Replaces the file with `data` (parents created; readers never see half a file)."""
        full = self._resolve(path)
        full.parent.mkdir(parents=True, exist_ok=True)
        staging = full.with_name(f".{full.name}.{os.getpid()}.tmp")
        staging.write_bytes(data)
        os.replace(staging, full)

    def append(self, path: str, data: bytes) -> None:
        """Appends `data`, creating the file and its parents when missing."""
        full = self._resolve(path)
        full.parent.mkdir(parents=True, exist_ok=True)
        with full.open("ab") as file:
            file.write(data)

    def exists(self, path: str) -> bool:
        """Whether `path` exists (file or directory)."""
        return self._resolve(path).exists()

    def stat(self, path: str) -> StorageStat | None:
        """Size and mtime, or None when missing."""
        try:
            found = self._resolve(path).stat()
        except FileNotFoundError:
            return None
        return StorageStat(size=found.st_size, mtime=found.st_mtime)

    def read_range(self, path: str, offset: int, length: int | None = None) -> bytes:
        """`length` bytes from `offset` (to the end when None); `FileNotFoundError` if missing."""
        with self._resolve(path).open("rb") as file:
            file.seek(offset)
            return file.read() if length is None else file.read(length)

    def list_dir(self, prefix: str) -> list[str]:
        """The sorted names directly under `prefix` (empty when it is not a directory)."""
        full = self._resolve(prefix)
        return sorted(child.name for child in full.iterdir()) if full.is_dir() else []

    def remove(self, path: str) -> None:
        """Deletes the file; nothing when missing."""
        self._resolve(path).unlink(missing_ok=True)

    def remove_dir(self, path: str) -> None:
        """Removes an empty directory; nothing when missing or not empty."""
        with contextlib.suppress(OSError):
            self._resolve(path).rmdir()

    def flush(self) -> None:
        """Nothing to flush: local writes go straight to disk."""

    def __enter__(self) -> LocalStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    async def aread(self, path: str) -> bytes:
        """`read` in a worker thread."""
        return await asyncio.to_thread(self.read, path)

    async def awrite(self, path: str, data: bytes) -> None:
        """`write` in a worker thread."""
        await asyncio.to_thread(self.write, path, data)

    async def aappend(self, path: str, data: bytes) -> None:
        """`append` in a worker thread."""
        await asyncio.to_thread(self.append, path, data)

    async def aexists(self, path: str) -> bool:
        """`exists` in a worker thread."""
        return await asyncio.to_thread(self.exists, path)

    async def astat(self, path: str) -> StorageStat | None:
        """`stat` in a worker thread."""
        return await asyncio.to_thread(self.stat, path)

    async def aread_range(self, path: str, offset: int, length: int | None = None) -> bytes:
        """`read_range` in a worker thread."""
        return await asyncio.to_thread(self.read_range, path, offset, length)

    async def alist_dir(self, prefix: str) -> list[str]:
        """`list_dir` in a worker thread."""
        return await asyncio.to_thread(self.list_dir, prefix)

    async def aremove(self, path: str) -> None:
        """`remove` in a worker thread."""
        await asyncio.to_thread(self.remove, path)

    async def aremove_dir(self, path: str) -> None:
        """`remove_dir` in a worker thread."""
        await asyncio.to_thread(self.remove_dir, path)

    async def __aenter__(self) -> LocalStorage:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


def _cloud_refusal(uri: str) -> ConfigError:
    scheme = uri.split("://", 1)[0].lower()
    package = CLOUD_BACKENDS.get(scheme)
    needs = f"`pip install fsspec {package}`" if package else f"fsspec and the {scheme}:// package"
    return ConfigError(
        f"storage {uri!r}: no {scheme}:// backend in rlpure, which stores runs on local paths "
        f"and file:// URIs only (the cookbook's {scheme}:// storage needs {needs})"
    )


class FsspecStorage:
    """The cookbook's fsspec (cloud) backend: refused when built, as rlpure runs no cloud store.

    Raises:
        ConfigError: always, in one line naming the backend package it would need.
    """

    def __init__(self, fs: Any, root: str = "", **fs_kwargs: Any) -> None:
        protocol = getattr(fs, "protocol", "cloud")
        scheme = protocol if isinstance(protocol, str) else protocol[0]
        raise _cloud_refusal(f"{scheme}://{root}")


def storage_from_uri(uri: str, **kwargs: Any) -> LocalStorage:
    """The storage a URI names: a local path or `file://` URI → `LocalStorage`.

    Args:
        uri: `/path/to/dir`, `relative/dir` or `file:///path/to/dir`.
        **kwargs: the cookbook's fsspec options; accepted, unused by the local backend.

    Raises:
        ConfigError: for any other `scheme://` URI (`s3://`, `gs://`, ...), naming the backend
            package it would need.
    """
    del kwargs
    if uri.startswith("file://"):
        return LocalStorage(uri[len("file://") :])
    if "://" in uri:
        raise _cloud_refusal(uri)
    return LocalStorage(uri)


def storage_join(*parts: str) -> str:
    """Joins storage path parts, normalized (`""` when all are empty).

    Examples:
        >>> storage_join("runs/", "/001", "", "metrics.jsonl")
        'runs/001/metrics.jsonl'
        >>> storage_join("", "")
        ''
    """
    joined = "/".join(stripped for part in parts if (stripped := part.strip("/")))
    return posixpath.normpath(joined) if joined else ""
