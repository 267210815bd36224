"""Tinker paths (`tinker://<run>/<weights|sampler_weights>/<name>`) ↔ the state directory.

Conventions:
- The server's checkpoints are the local backend's (`shell.local`): `<state_dir>/checkpoints/
  <run>/<state|sampler>/<name>`, where `<run>` is the training run's model id
  (`{session_id}:train:{n}`). The SDK's kinds map one to one: `weights` ↔ `state`,
  `sampler_weights` ↔ `sampler`.
- A path from a request resolves only inside `<state_dir>/checkpoints`: exactly three parts
  after `tinker://`, each a plain folder name (no `/`, `\\`, `.` or `..`, no NUL); anything else
  is a `PathError` naming the path and what is wrong. Filesystem paths are refused: a client
  names checkpoints the way the server returned them.
- A checkpoint id in REST routes is `"<kind>/<name>"` with the SDK's kinds
  (`weights/000010`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import msgspec

from shell.errors import RlpureError

__all__ = [
    "CheckpointRef",
    "PathError",
    "check_folder_name",
    "parse_checkpoint_id",
    "parse_tinker_path",
    "ref_from_directory",
]

SdkKind = Literal["weights", "sampler_weights"]
LocalKind = Literal["state", "sampler"]

_TO_LOCAL: dict[str, LocalKind] = {"weights": "state", "sampler_weights": "sampler"}
_TO_SDK: dict[str, SdkKind] = {"state": "weights", "sampler": "sampler_weights"}
_SCHEME = "tinker://"


class PathError(RlpureError, ValueError):
    """A checkpoint path or id in a request that does not name a checkpoint of this server."""


def check_folder_name(name: str, what: str) -> str:
    """`name` if it is a plain folder name, else `PathError` naming `what`."""
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        encoded = b""  # a lone surrogate: no file system takes it
    if (
        not encoded
        or name in (".", "..")
        or any(bad in name for bad in ("/", "\\", "\x00"))
        or len(encoded) > 255
    ):
        raise PathError(
            f"{what}: {name!r} is not a plain name (no '/', '\\', '.' or '..'; at most 255 "
            "bytes of UTF-8)"
        )
    return name


class CheckpointRef(msgspec.Struct, frozen=True, kw_only=True):
    """A checkpoint of this server: its training run, SDK kind and name."""

    run: str
    kind: SdkKind
    name: str

    @property
    def tinker_path(self) -> str:
        """`tinker://<run>/<kind>/<name>`."""
        return f"{_SCHEME}{self.run}/{self.kind}/{self.name}"

    @property
    def checkpoint_id(self) -> str:
        """`<kind>/<name>`, the SDK's checkpoint id."""
        return f"{self.kind}/{self.name}"

    def directory(self, checkpoint_root: Path) -> Path:
        """The checkpoint's folder under `checkpoint_root` (`<state_dir>/checkpoints`)."""
        return checkpoint_root / self.run / _TO_LOCAL[self.kind] / self.name


def parse_tinker_path(path: object, *, field: str = "path") -> CheckpointRef:
    """The checkpoint `path` names (`tinker://<run>/<weights|sampler_weights>/<name>`).

    Raises:
        PathError: not a string, not a `tinker://` path, not three parts, an unknown kind or a
            part that is not a plain name; the message names `field`.

    Examples:
        >>> parse_tinker_path("tinker://s1:train:0/weights/000010").name
        '000010'
    """
    if not isinstance(path, str):
        raise PathError(f"{field}: expected a tinker:// path, got {type(path).__name__}")
    if not path.startswith(_SCHEME):
        raise PathError(
            f"{field}: {path!r} is not a tinker:// path (this server names checkpoints "
            "tinker://<run>/<weights|sampler_weights>/<name>, as its save calls return them)"
        )
    parts = path[len(_SCHEME) :].split("/")
    if len(parts) != 3:
        raise PathError(f"{field}: {path!r} must have three parts: tinker://<run>/<kind>/<name>")
    run, kind, name = parts
    if kind not in _TO_LOCAL:
        raise PathError(
            f"{field}: {path!r}: unknown checkpoint kind {kind!r} (weights or sampler_weights)"
        )
    return CheckpointRef(
        run=check_folder_name(run, f"{field} run"),
        kind="weights" if kind == "weights" else "sampler_weights",
        name=check_folder_name(name, f"{field} name"),
    )


def parse_checkpoint_id(run: str, checkpoint_id: str) -> CheckpointRef:
    """The checkpoint `checkpoint_id` (`weights/<name>` or `sampler_weights/<name>`) of `run`.

    Raises:
        PathError: a malformed id or run.
    """
    return parse_tinker_path(f"{_SCHEME}{run}/{checkpoint_id}", field="checkpoint_id")


def ref_from_directory(directory: str | os.PathLike[str], checkpoint_root: Path) -> CheckpointRef:
    """The `CheckpointRef` of a local checkpoint folder under `checkpoint_root`.

    Raises:
        PathError: the folder is not `<root>/<run>/<state|sampler>/<name>`.
    """
    path = Path(os.path.abspath(directory))
    try:
        run, kind, name = path.relative_to(os.path.abspath(checkpoint_root)).parts
    except ValueError as err:
        raise PathError(f"{str(path)!r} is not a checkpoint under {checkpoint_root}") from err
    if kind not in _TO_SDK:
        raise PathError(f"{str(path)!r}: unknown local checkpoint kind {kind!r}")
    return CheckpointRef(run=run, kind=_TO_SDK[kind], name=name)
