"""Checkpoints of the local backend: a directory holding `arrays.npz` and `manifest.json`.

Conventions:
- Arrays are named by their pytree path under a prefix: `params/...` for the weights and
  `optimizer/...` for the Adam state (present only in `"state"` checkpoints, absent in
  `"sampler"` ones). They are loaded with `allow_pickle=False` and checked, name by name,
  against the shapes and dtypes of the manifest's config (abstract shapes: nothing is
  allocated before the arrays are known to match).
- `manifest.json` is a JSON object (`_Manifest`): the format tag, the kind, the base model
  name, the `ModelConfig`, the `LoraConfig` of a LoRA checkpoint (then the arrays are the
  adapters, `params/...`, and their Adam state: the pretrained base weights are never
  written, and loading needs the same base model), whether optimizer state is present, the optimizer step count (it keys
  the sampling streams, so a resumed run continues exactly), the sorted names of the arrays in
  `arrays.npz` and the checkpoint's user metadata (`save_state(user_metadata=)`). Every key is
  required and strictly typed, except two that checkpoints of earlier rlpure versions lack: the
  id of the training run that saved it (`training_run_id`, default: the folder two levels up,
  `<checkpoint_dir>/<run id>/<kind>/<name>`) and that run's metadata (`run_metadata`, the
  `user_metadata` its training client was created with, default `{}`), which the REST client's
  `get_training_run_by_tinker_path` returns as the SDK's does (the cookbook reads the renderer
  name from it on resume).
- Writing is crash-safe: a checkpoint is written (and fsynced) in a fresh hidden sibling
  `.{name}.tmp-{pid}@{host}-{hex}` (`host`: 8 hex digits of the host name's hash) and renamed
  into place, so the real name never holds a half-written one. A write killed before its rename
  leaves that folder behind; the next write into the same folder removes such leftovers
  (`remove_stale_staging`): only names of this pattern, only when the writing process is gone
  (or is this one and the write is no longer in flight), never the `.tmp-` copy of an
  interrupted overwrite (below). A pid can only be probed on its own host: a leftover of
  another host (a shared mount), or one named by an earlier rlpure (`.{name}.tmp-{hex}`, no
  pid), is removed only once it is an hour old.
  Overwriting renames the old checkpoint aside (`.{name}.old-*`) first, moves the new one in,
  and only then deletes the old one; if the move fails the old one is put back. A process killed
  between the two renames leaves both copies on disk (old under `.old-*`, new under `.tmp-*`),
  and reading the real name then raises an error that points at them.
- Every way a checkpoint can be unusable (unreadable or truncated files, a manifest that is not
  an object, an unknown format tag, a missing or mistyped key, a bad config, arrays that differ
  from the manifest's list or the config's shapes) raises `CheckpointError` naming the
  checkpoint path, the file and what is wrong.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import time
import uuid
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import jax
import jax.numpy as jnp
import msgspec
import numpy as np

from rlpure import model as model_lib
from shell.errors import CheckpointError

logger = logging.getLogger(__name__)

__all__ = [
    "Checkpoint",
    "CheckpointInfo",
    "checked_metadata",
    "checkpoint_name",
    "delete_checkpoint",
    "move_into_place",
    "read_checkpoint",
    "read_checkpoint_info",
    "remove_stale_staging",
    "write_checkpoint",
]

_CHECKPOINT_FORMAT = "rlpure-local-checkpoint-v1"

# What `np.load` and reading an npz member raise on a missing, truncated or corrupt file.
_NPZ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile)


class _Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """The contents of `manifest.json` (validated with `msgspec.convert`, strict types)."""

    format: str
    kind: Literal["state", "sampler"]
    base_model: str
    config: model_lib.ModelConfig
    has_optimizer: bool
    optim_steps: Annotated[int, msgspec.Meta(ge=0)]
    arrays: tuple[str, ...]
    user_metadata: dict[str, str]
    training_run_id: str | None = None
    run_metadata: dict[str, str] = {}
    lora: model_lib.LoraConfig | None = None


def _named_leaves(tree: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """Yields `("prefix/a/0/b", leaf)` for every leaf of `tree` (names from the pytree paths)."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        parts = []
        for entry in path:
            for attr in ("key", "idx", "name"):
                if hasattr(entry, attr):
                    parts.append(str(getattr(entry, attr)))
                    break
        yield "/".join([prefix, *parts]), leaf


def _tree_to_named_arrays(tree: Any, prefix: str) -> dict[str, np.ndarray]:
    """Flattens a pytree to `{"prefix/a/0/b": array}`."""
    return {name: np.asarray(leaf) for name, leaf in _named_leaves(tree, prefix)}


def _named_arrays_to_tree(
    template: Any, prefix: str, arrays: Mapping[str, np.ndarray], where: str
) -> Any:
    """Inverse of `_tree_to_named_arrays`, checking names, shapes and dtypes against `template`
    (a pytree of anything with `.shape` and `.dtype`, e.g. `jax.ShapeDtypeStruct`)."""
    leaves = []
    for name, like in _named_leaves(template, prefix):
        if name not in arrays:
            raise CheckpointError(f"{where}: arrays.npz: array {name!r} is missing")
        got = arrays[name]
        if got.shape != like.shape or got.dtype != like.dtype:
            raise CheckpointError(
                f"{where}: arrays.npz: array {name!r} has shape {got.shape} dtype {got.dtype}, "
                f"expected {like.shape} {like.dtype}"
            )
        leaves.append(jnp.asarray(got))
    treedef = jax.tree_util.tree_structure(template)
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _fsync_directory(directory: Path) -> None:
    """Makes the renames inside `directory` durable (best effort: not every OS allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def move_into_place(staging: Path, directory: Path) -> None:
    """Renames the complete `staging` to `directory`; an existing `directory` is renamed aside
    first and deleted only once the new one is in place (put back if the move fails). Used for
    every folder the local backend writes whole (checkpoints, tokenizer folders)."""
    if not directory.exists() and not directory.is_symlink():
        os.replace(staging, directory)
        _fsync_directory(directory.parent)
        return
    aside = directory.parent / f".{directory.name}.old-{uuid.uuid4().hex}"
    os.replace(directory, aside)
    try:
        os.replace(staging, directory)
    except BaseException:
        os.replace(aside, directory)
        raise
    _fsync_directory(directory.parent)
    try:
        if aside.is_dir() and not aside.is_symlink():
            shutil.rmtree(aside)
        else:
            aside.unlink(missing_ok=True)
    except OSError as error:  # the new folder is in place: the save did not fail
        logger.warning("%s saved, but its old copy %s was not deleted: %s", directory, aside, error)


_STAGING = re.compile(
    r"^\.(?P<name>.+)\.tmp-(?:(?P<pid>\d+)(?:@(?P<host>[0-9a-f]{8}))?-)?[0-9a-f]{32}$"
)
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
"""This host's tag in staging names: pids are only meaningful on the host that ran them."""
_LEGACY_STAGING_AGE_S = 3600.0
_IN_FLIGHT: set[Path] = set()
"""Staging folders this process is writing now (never removed as leftovers)."""


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def _is_stale(path: Path, match: re.Match[str]) -> bool:
    """Whether the staging folder `path` is a leftover no writer will finish or rename."""
    name = match["name"]
    interrupted_overwrite = not (path.parent / name).exists() and any(
        path.parent.glob(f".{glob.escape(name)}.old-*")
    )
    if interrupted_overwrite:
        return False  # may be the complete new copy: `_interrupted_overwrite_hint` names it
    if match["pid"] is None or match["host"] not in (None, _HOST):
        try:
            age = time.time() - path.stat().st_mtime
        except OSError:
            return False
        return age > _LEGACY_STAGING_AGE_S
    pid = int(match["pid"])
    if pid == os.getpid():
        return path not in _IN_FLIGHT
    return not _process_alive(pid)


def remove_stale_staging(directory: Path) -> None:
    """Removes the leftover staging folders of interrupted writes in `directory` (writers
    that are gone; see the module docstring)."""
    try:
        entries = list(directory.iterdir())
    except OSError:
        return
    for path in entries:
        match = _STAGING.match(path.name)
        if match is None or not path.is_dir() or path.is_symlink() or not _is_stale(path, match):
            continue
        logger.info("removing %s, left by an interrupted checkpoint write", path)
        shutil.rmtree(path, ignore_errors=True)


def checked_metadata(metadata: object, where: str) -> dict[str, str] | None:
    """`metadata` as a `dict[str, str]` copy (or `None`); a clear `TypeError` otherwise (the
    SDK's requests declare `user_metadata: dict[str, str] | None`)."""
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in metadata.items()
    ):
        raise TypeError(f"{where}: expected a dict[str, str] or None, got {metadata!r}")
    return dict(metadata)


def write_checkpoint(
    directory: Path,
    *,
    base_model: str,
    config: model_lib.ModelConfig,
    params: model_lib.Params,
    opt_state: Any | None,
    optim_steps: int,
    kind: Literal["state", "sampler"],
    user_metadata: Mapping[str, str] | None,
    training_run_id: str | None = None,
    run_metadata: Mapping[str, str] | None = None,
    lora: model_lib.LoraConfig | None = None,
) -> None:
    """Writes a checkpoint directory at `directory`, replacing one that exists (crash-safe: see
    the module docstring; the caller decides whether overwriting is allowed).

    `opt_state=None` writes weights only (a sampler checkpoint); `kind` is recorded in the
    manifest (`"state"` or `"sampler"`); `training_run_id` and `run_metadata` name the training
    run that saved it and that run's metadata. With `lora`, `params` are the LoRA adapters of
    the pretrained `base_model` of shape `config` (and `opt_state` their Adam state): the base
    weights are not written.

    Raises:
        TypeError: `user_metadata` is not a `dict[str, str]` or None (nothing is written: the
            manifest could not be read back).
    """
    where = "save_state" if kind == "state" else "save_weights_for_sampler"
    user_metadata = checked_metadata(user_metadata, f"{where}.user_metadata")
    directory.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(directory.parent)
    staging = directory.parent / f".{directory.name}.tmp-{os.getpid()}@{_HOST}-{uuid.uuid4().hex}"
    _IN_FLIGHT.add(staging)
    try:
        staging.mkdir()
        _write_staged(
            staging,
            directory,
            base_model=base_model,
            config=config,
            params=params,
            opt_state=opt_state,
            optim_steps=optim_steps,
            kind=kind,
            user_metadata=user_metadata,
            training_run_id=training_run_id,
            run_metadata=run_metadata,
            lora=lora,
        )
    finally:
        _IN_FLIGHT.discard(staging)


def _write_staged(
    staging: Path,
    directory: Path,
    *,
    base_model: str,
    config: model_lib.ModelConfig,
    params: model_lib.Params,
    opt_state: Any | None,
    optim_steps: int,
    kind: Literal["state", "sampler"],
    user_metadata: Mapping[str, str] | None,
    training_run_id: str | None,
    run_metadata: Mapping[str, str] | None,
    lora: model_lib.LoraConfig | None,
) -> None:
    """Fills `staging` and moves it to `directory` (`staging` removed if anything fails)."""
    try:
        arrays = _tree_to_named_arrays(params, "params")
        if opt_state is not None:
            arrays.update(_tree_to_named_arrays(opt_state, "optimizer"))
        manifest = _Manifest(
            format=_CHECKPOINT_FORMAT,
            kind=kind,
            base_model=base_model,
            config=config,
            has_optimizer=opt_state is not None,
            optim_steps=optim_steps,
            arrays=tuple(sorted(arrays)),
            user_metadata=dict(user_metadata or {}),
            training_run_id=training_run_id,
            run_metadata=dict(run_metadata or {}),
            lora=lora,
        )
        with open(staging / "arrays.npz", "wb") as file:
            np.savez(file, **arrays)  # type: ignore[arg-type]
            file.flush()
            os.fsync(file.fileno())
        with open(staging / "manifest.json", "w", encoding="utf-8") as file:
            json.dump(msgspec.to_builtins(manifest), file, indent=2, sort_keys=True)
            file.flush()
            os.fsync(file.fileno())
        move_into_place(staging, directory)
    except BaseException as err:
        # `staging` holds only this unfinished write; whatever was at `directory` is untouched
        # (or was put back by `move_into_place`).
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(err, OSError) and err.errno in _FULL_OR_READ_ONLY:  # say where
            raise CheckpointError(f"checkpoint {directory}: cannot write it: {err}") from err
        raise


_FULL_OR_READ_ONLY = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
"""Write errors that are the disk's state; their messages name no file, so the checkpoint's
path is added."""


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    """A checkpoint read back: weights, Adam state (`None` unless asked for) and step count.

    With `lora` set, `params` are LoRA adapters of the pretrained `base_model` (shape `config`).
    """

    base_model: str
    config: model_lib.ModelConfig
    params: model_lib.Params
    opt_state: Any | None
    optim_steps: int
    lora: model_lib.LoraConfig | None = None


def _interrupted_overwrite_hint(directory: Path) -> str:
    """Names the copies an interrupted overwrite of `directory` left behind (or `""`)."""
    if directory.exists() or not directory.parent.is_dir():
        return ""
    pattern = f".{glob.escape(directory.name)}.*-*"
    leftovers = sorted(str(p) for p in directory.parent.glob(pattern) if p.is_dir())
    if not leftovers:
        return ""
    return (
        f" (an interrupted write left {leftovers}: an '.old-' copy is the previous checkpoint, "
        f"a '.tmp-' copy may be incomplete)"
    )


def _temporary_dir_hint(directory: Path) -> str:
    """Explains a missing checkpoint that lived in a service's temporary directory (or `""`)."""
    if directory.exists() or not any(part.startswith("rlpure-local-") for part in directory.parts):
        return ""
    return (
        " (it was saved in the temporary checkpoint directory of a LocalServiceClient made with "
        "temporary_checkpoints=True, which is removed when that process exits; to resume in a "
        "new process, leave the default (durable: $RLPURE_HOME/checkpoints or "
        "~/.local/share/rlpure/checkpoints) or pass checkpoint_dir=..., e.g. "
        "functools.partial(LocalServiceClient, checkpoint_dir='<log_path>/local_states'))"
    )


def _read_manifest(directory: Path, where: str) -> _Manifest:
    """Reads and validates `directory/manifest.json` (see `_Manifest`)."""
    try:
        text = (directory / "manifest.json").read_text(encoding="utf-8")
    except (OSError, ValueError) as err:  # ValueError: not UTF-8
        hint = _interrupted_overwrite_hint(directory) or _temporary_dir_hint(directory)
        raise CheckpointError(f"{where}: cannot read manifest.json: {err}{hint}") from err
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise CheckpointError(f"{where}: manifest.json is not valid JSON: {err}") from err
    if not isinstance(raw, dict):
        raise CheckpointError(
            f"{where}: manifest.json must hold a JSON object, got {type(raw).__name__} "
            f"{text[:80]!r}"
        )
    if raw.get("format") != _CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"{where}: manifest.json: unknown format {raw.get('format')!r} (expected "
            f"{_CHECKPOINT_FORMAT!r})"
        )
    try:
        return msgspec.convert(raw, _Manifest)
    except msgspec.ValidationError as err:
        raise CheckpointError(f"{where}: manifest.json: {err}") from err


def read_checkpoint(path: str, *, with_optimizer: bool) -> Checkpoint:
    """Reads and validates the checkpoint directory `path`.

    Raises:
        CheckpointError: unreadable or truncated files, a malformed manifest (not an object,
            unknown format, missing or mistyped keys, bad config), arrays that differ from the
            manifest's list or the config's shapes, or no optimizer state when
            `with_optimizer` is True. The message names `path`, the file and the fault.
    """
    directory = Path(path)
    where = f"checkpoint {path!r}"
    manifest = _read_manifest(directory, where)
    if with_optimizer and not manifest.has_optimizer:
        raise CheckpointError(f"{where}: holds no optimizer state (a sampler checkpoint?)")
    try:
        with np.load(directory / "arrays.npz", allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except _NPZ_ERRORS as err:
        raise CheckpointError(f"{where}: cannot read arrays.npz: {err}") from err

    config = manifest.config
    lora = manifest.lora
    if lora is None:
        template = jax.eval_shape(lambda: model_lib.init_params(jax.random.key(0), config))
    else:
        template = jax.eval_shape(lambda: model_lib.init_lora(jax.random.key(0), config, lora))
    expected = {name for name, _ in _named_leaves(template, "params")}
    opt_template = None
    if manifest.has_optimizer:
        opt_template = jax.eval_shape(model_lib.init_optimizer_state, template)
        expected.update(name for name, _ in _named_leaves(opt_template, "optimizer"))
    listed = set(manifest.arrays)
    for fault, names in (
        ("arrays.npz holds arrays manifest.json does not list", set(arrays) - listed),
        ("manifest.json lists arrays arrays.npz does not hold", listed - set(arrays)),
        ("manifest.json lists arrays its config does not have", listed - expected),
        ("manifest.json does not list arrays its config has", expected - listed),
    ):
        if names:
            shown = sorted(names)
            more = f" and {len(shown) - 5} more" if len(shown) > 5 else ""
            raise CheckpointError(f"{where}: {fault}: {shown[:5]}{more}")

    params = _named_arrays_to_tree(template, "params", arrays, where)
    opt_state = None
    if with_optimizer:
        opt_state = _named_arrays_to_tree(opt_template, "optimizer", arrays, where)
    return Checkpoint(
        base_model=manifest.base_model,
        config=config,
        params=params,
        opt_state=opt_state,
        optim_steps=manifest.optim_steps,
        lora=lora,
    )


def checkpoint_name(name: Any) -> str:
    """`name` if it is a plain file name (no separators, not `.` or `..`), else `ValueError`."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ValueError(f"checkpoint name must be a non-empty file name, got {name!r}")
    return name


class CheckpointInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What the manifest says of a checkpoint (no arrays read), for the REST client."""

    path: str
    """The checkpoint directory, as given."""
    name: str
    kind: Literal["state", "sampler"]
    base_model: str
    training_run_id: str
    run_metadata: dict[str, str]
    user_metadata: dict[str, str]
    saved_at: float
    """When it was written (the manifest's modification time, seconds since the epoch)."""
    size_bytes: int
    lora: model_lib.LoraConfig | None = None
    """The adapters' config of a LoRA checkpoint (None: full weights of a toy model)."""


def read_checkpoint_info(path: str) -> CheckpointInfo:
    """Reads the manifest of the checkpoint directory `path` (not its arrays).

    Raises:
        CheckpointError: no readable, valid manifest (as `read_checkpoint`).
    """
    directory = Path(path)
    where = f"checkpoint {path!r}"
    manifest = _read_manifest(directory, where)
    try:
        saved_at = (directory / "manifest.json").stat().st_mtime
        size = sum(entry.stat().st_size for entry in directory.iterdir() if entry.is_file())
    except OSError as err:
        raise CheckpointError(f"{where}: cannot stat its files: {err}") from err
    run_id = manifest.training_run_id
    if run_id is None:  # an earlier rlpure's checkpoint: <checkpoint_dir>/<run id>/<kind>/<name>
        run_id = Path(os.path.abspath(directory)).parent.parent.name
    return CheckpointInfo(
        path=path,
        name=directory.name,
        kind=manifest.kind,
        base_model=manifest.base_model,
        training_run_id=run_id,
        run_metadata=dict(manifest.run_metadata),
        user_metadata=dict(manifest.user_metadata),
        saved_at=saved_at,
        size_bytes=size,
        lora=manifest.lora,
    )


def delete_checkpoint(path: str) -> None:
    """Deletes the checkpoint directory `path`, once its manifest shows it is one.

    Only a directory holding a valid local-checkpoint manifest is removed, so a wrong path never
    deletes anything else.

    Raises:
        CheckpointError: `path` is not a readable local checkpoint (nothing is deleted).
    """
    read_checkpoint_info(path)
    try:
        shutil.rmtree(path)
    except OSError as err:
        raise CheckpointError(f"checkpoint {path!r}: cannot delete it: {err}") from err
