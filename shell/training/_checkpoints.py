"""Checkpoints: `save_state` plus a `checkpoints.jsonl` record; resuming from the last one.

Conventions:
- A `CheckpointRecord` is written **after** the backend confirmed `save_state`, as one JSON line
  appended to `<log_dir>/checkpoints.jsonl` and fsynced, so a record always names a state that
  exists. `step` is the number of completed training steps, i.e. the index of the next step to
  run; `rng_key_data` is the loop's jax PRNG key data after those steps, so a resumed run draws
  the same per-step seeds as an uninterrupted one.
- Resuming creates the training client from the saved state *with* optimizer state
  (`create_training_client_from_state_with_optimizer`, the SDK 0.38 way), and the loop drops
  metrics and samples logged at or after `step`.
- A torn last line (a kill during the append) is ignored with a warning; any other unreadable
  line raises `CheckpointError` naming the file and line.
- Records hold paths and numbers only: never credentials.
- Log directories are relocatable: a state the backend saved inside the log dir (the local
  backend's `<log_dir>/local_states/...`) is recorded by its path relative to the log dir
  (`local_states/local-0-0/state/step_000004_...`), and `load_checkpoints` resolves it against
  the log dir it reads, so `mv D D2` keeps every record usable. A URI (`tinker://...`,
  `fake://...`) is the service's name for a state and is kept as it is. A state saved outside
  the log dir is recorded by its absolute path (with a warning: that log dir cannot be resumed
  once moved), and reading refuses any record whose path lies outside the log dir it is read
  from — a relative path climbing out with `..`, or an absolute one such as a copied log dir's
  records naming the original's states — with a `CheckpointError` saying how to fix it. Records
  written by earlier rlpure versions (absolute paths) still resume while they point inside the
  log dir they are read from.
"""

from __future__ import annotations

import logging
import os
import re
import time
from functools import cache
from pathlib import Path
from typing import Annotated

import jax
import msgspec
import numpy as np

from shell.clients import ServiceClient, TrainingClient
from shell.errors import CheckpointError

__all__ = [
    "CHECKPOINTS_FILE",
    "CheckpointRecord",
    "append_checkpoint",
    "check_states_exist",
    "last_checkpoint",
    "load_checkpoints",
    "recorded_path",
    "resolved_path",
    "restore_training_client",
    "save_checkpoint",
]

logger = logging.getLogger(__name__)

CHECKPOINTS_FILE = "checkpoints.jsonl"
"""One `CheckpointRecord` per saved state, in the log dir."""


class CheckpointRecord(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """One line of `checkpoints.jsonl`.

    Attributes:
        step: completed training steps (the next step index to run), >= 0.
        name: the `save_state` name.
        state_path: the path the backend returned (e.g. `tinker://...` or a directory); in the
            file, relative to the log dir when inside it (see the module docstring).
        rng_key_data: uint32 words of the loop's jax PRNG key after `step` steps.
        final: whether the run ended here.
        wall_time: unix time of the save.
        kl_reference_path: sampler weights of the KL reference saved at the start of the run
            (None when the run has no KL penalty or names a reference model).
    """

    step: int
    name: str
    state_path: str
    rng_key_data: tuple[Annotated[int, msgspec.Meta(ge=0, lt=2**32)], ...]
    final: bool = False
    wall_time: float = 0.0
    kl_reference_path: str | None = None

    def __post_init__(self) -> None:
        if self.step < 0:
            raise ValueError(f"CheckpointRecord.step: expected >= 0, got {self.step}")
        if not self.state_path:
            raise ValueError("CheckpointRecord.state_path: empty")


_DECODER = msgspec.json.Decoder(CheckpointRecord)
_ENCODER = msgspec.json.Encoder()

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
"""A service's name for a state (`tinker://...`): not a path of this machine."""


def _is_uri(path: str) -> bool:
    return _URI.match(path) is not None


_WARNED_OUTSIDE: set[Path] = set()
"""Log dirs already warned about states saved outside them (one warning per run, not per save)."""


def recorded_path(path: str, log_dir: str | os.PathLike[str]) -> str:
    """How a record stores the backend's `path`: relative to `log_dir` when inside it.

    Examples:
        >>> recorded_path("/runs/a/local_states/m/state/s", "/runs/a")
        'local_states/m/state/s'
        >>> recorded_path("tinker://run-1/weights/s", "/runs/a")
        'tinker://run-1/weights/s'
    """
    if _is_uri(path):
        return path
    absolute = Path(os.path.abspath(path))
    root = Path(os.path.abspath(log_dir))
    if absolute.is_relative_to(root):
        return absolute.relative_to(root).as_posix()
    # compare resolved paths too: a log dir reached through a symlink
    if absolute.resolve().is_relative_to(root.resolve()):
        return absolute.resolve().relative_to(root.resolve()).as_posix()
    if root not in _WARNED_OUTSIDE:
        _WARNED_OUTSIDE.add(root)
        logger.warning(
            "%s: the state %s is saved outside this log dir, so the log dir cannot be resumed "
            "from elsewhere, nor at all once that state is gone (a default LocalServiceClient() "
            "deletes its temporary states at exit; the local backend keeps states inside the "
            "log dir with "
            "LocalServiceClient(checkpoint_dir=<log_dir>/local_states), the CLI's default)",
            root,
            path,
        )
    return str(absolute)


def _legacy_hint(path: Path) -> str:
    """How to convert a record an earlier rlpure wrote with an absolute `path`."""
    parts = path.parts
    if "local_states" in parts:
        old = Path(*parts[: parts.index("local_states")])
        return (
            f" If this log dir was moved from {old}, make its records relative: "
            f"sed -i 's#\"{old}/#\"#g' {CHECKPOINTS_FILE}"
        )
    return " A record may only name states inside its log dir (or a service URI)."


def resolved_path(stored: str, log_dir: Path, *, where: str) -> str:
    """The path a record's `stored` path names, read from `log_dir` (URIs as they are).

    Raises:
        CheckpointError: `stored` lies outside `log_dir` (message says how to fix it).
    """
    if _is_uri(stored):
        return stored
    # Lexical containment, not `resolve()`: a `local_states` that is a symlink to another disk
    # stays inside the log dir as far as its records go.
    root = Path(os.path.abspath(log_dir))
    path = Path(stored)
    if not path.is_absolute() and ".." not in path.parts:
        return str(root / path)
    target = Path(os.path.normpath(path)) if path.is_absolute() else None
    if target is not None and (
        target.is_relative_to(root) or target.resolve().is_relative_to(root.resolve())
    ):
        return str(target)
    if path.is_absolute():
        raise CheckpointError(
            f"{where}: the state {stored} lies outside the log dir {root} (a log dir copied or "
            "moved from elsewhere, or written by an rlpure that recorded absolute paths); "
            "resuming it would load another run's weights." + _legacy_hint(path)
        )
    raise CheckpointError(f"{where}: the state {stored!r} climbs out of the log dir {root}")


@cache
def _key_words() -> int:
    """How many uint32 words the loop's PRNG key has (2 for jax's default threefry)."""
    return int(np.asarray(jax.random.key_data(jax.random.key(0))).size)


def load_checkpoints(log_dir: str | os.PathLike[str]) -> list[CheckpointRecord]:
    """All checkpoint records of a log directory, oldest first (none: empty list), their paths
    resolved against `log_dir` (absolute paths; URIs as recorded).

    Raises:
        CheckpointError: a line other than the last cannot be decoded, or names a state
            outside `log_dir` (see the module docstring).
    """
    path = Path(log_dir) / CHECKPOINTS_FILE
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = _DECODER.decode(line)
        except msgspec.DecodeError as err:
            if number == len(lines) and not data.endswith(b"\n"):
                logger.warning("%s: ignoring torn last line %d (%s)", path, number, err)
                break
            raise CheckpointError(f"{path}: line {number}: {err}") from None
        where = f"{path}: line {number}"
        if len(record.rng_key_data) != _key_words():
            raise CheckpointError(
                f"{where}: field 'rng_key_data': expected {_key_words()} uint32 words (the "
                f"loop's jax PRNG key), got {len(record.rng_key_data)}"
            )
        records.append(
            msgspec.structs.replace(
                record,
                state_path=resolved_path(record.state_path, path.parent, where=where),
                kl_reference_path=(
                    None
                    if record.kl_reference_path is None
                    else resolved_path(record.kl_reference_path, path.parent, where=where)
                ),
            )
        )
    return records


def check_states_exist(record: CheckpointRecord, log_dir: str | os.PathLike[str]) -> None:
    """Refuses a record (read by `load_checkpoints`) whose saved files are not on disk.

    Catches a log dir copied without the states it holds (`local_states/`), which would
    otherwise fail deep in the backend, or with older absolute records load the original's.

    Raises:
        CheckpointError: naming the record's step, the missing path and the likely cause.
    """
    for label, path in (("state", record.state_path), ("KL reference", record.kl_reference_path)):
        if path is not None and not _is_uri(path) and not Path(path).exists():
            raise CheckpointError(
                f"{Path(log_dir) / CHECKPOINTS_FILE}: the step-{record.step} checkpoint's "
                f"{label} {path} is missing (a log dir copied or moved without the states it "
                "holds, e.g. local_states/? copy or move the whole directory)"
            )


def last_checkpoint(log_dir: str | os.PathLike[str]) -> CheckpointRecord | None:
    """The most recent checkpoint record of `log_dir`, or None."""
    records = load_checkpoints(log_dir)
    return records[-1] if records else None


def append_checkpoint(log_dir: str | os.PathLike[str], record: CheckpointRecord) -> None:
    """Appends `record` to `<log_dir>/checkpoints.jsonl` and fsyncs it."""
    path = Path(log_dir) / CHECKPOINTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as f:
        # A torn last line (a crash mid-append) would glue onto this record and make the
        # file unreadable: cut back to the last complete line first.
        size = f.tell()
        if size:
            with path.open("rb") as r:
                data = r.read()
            if not data.endswith(b"\n"):
                keep = data.rfind(b"\n") + 1
                logger.warning("%s: dropping a torn last line before appending", path)
                f.truncate(keep)
        f.write(_ENCODER.encode(record) + b"\n")
        f.flush()
        os.fsync(f.fileno())


async def save_checkpoint(
    training_client: TrainingClient,
    *,
    log_dir: str | os.PathLike[str],
    step: int,
    rng_key_data: tuple[int, ...],
    final: bool = False,
    kl_reference_path: str | None = None,
) -> CheckpointRecord:
    """Saves the training state (weights and optimizer) and records it.

    Args:
        training_client: the run's training client.
        log_dir: the run's log directory.
        step: completed training steps.
        rng_key_data: the loop's PRNG key data after `step` steps.
        final: mark the record as the end of the run.
        kl_reference_path: where the run's KL reference weights are, carried over on resume.

    Returns:
        The record appended to `checkpoints.jsonl`, with the paths as given (what
        `load_checkpoints` reads back; the file holds them relative to `log_dir`).
    """
    # A unique suffix: a run killed between `save_state` and the record below, or resumed from
    # an earlier checkpoint, saves the same step again and must not collide with that state.
    name = f"step_{step:06d}" + ("_final" if final else "") + f"_{time.time_ns():x}"
    response = await training_client.save_state(name)
    record = CheckpointRecord(
        step=step,
        name=name,
        state_path=str(response.path),
        rng_key_data=tuple(int(x) for x in rng_key_data),
        final=final,
        wall_time=time.time(),
        kl_reference_path=kl_reference_path,
    )
    append_checkpoint(
        log_dir,
        msgspec.structs.replace(
            record,
            state_path=recorded_path(record.state_path, log_dir),
            kl_reference_path=(
                None if kl_reference_path is None else recorded_path(kl_reference_path, log_dir)
            ),
        ),
    )
    return record


async def restore_training_client(
    service_client: ServiceClient, record: CheckpointRecord
) -> TrainingClient:
    """A training client with the weights and optimizer state of `record`."""
    return await service_client.create_training_client_from_state_with_optimizer(record.state_path)
