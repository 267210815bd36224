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
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import msgspec

from shell.clients import ServiceClient, TrainingClient
from shell.errors import CheckpointError

__all__ = [
    "CHECKPOINTS_FILE",
    "CheckpointRecord",
    "append_checkpoint",
    "last_checkpoint",
    "load_checkpoints",
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
        state_path: the path the backend returned (e.g. `tinker://...` or a directory).
        rng_key_data: uint32 words of the loop's jax PRNG key after `step` steps.
        final: whether the run ended here.
        wall_time: unix time of the save.
        kl_reference_path: sampler weights of the KL reference saved at the start of the run
            (None when the run has no KL penalty or names a reference model).
    """

    step: int
    name: str
    state_path: str
    rng_key_data: tuple[int, ...]
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


def load_checkpoints(log_dir: str | os.PathLike[str]) -> list[CheckpointRecord]:
    """All checkpoint records of a log directory, oldest first (none: empty list).

    Raises:
        CheckpointError: a line other than the last cannot be decoded.
    """
    path = Path(log_dir) / CHECKPOINTS_FILE
    if not path.exists():
        return []
    lines = path.read_bytes().splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(_DECODER.decode(line))
        except msgspec.DecodeError as err:
            if number == len(lines) and not path.read_bytes().endswith(b"\n"):
                logger.warning("%s: ignoring torn last line %d (%s)", path, number, err)
                break
            raise CheckpointError(f"{path}: line {number}: {err}") from None
    return records


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
        The record appended to `checkpoints.jsonl`.
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
    append_checkpoint(log_dir, record)
    return record


async def restore_training_client(
    service_client: ServiceClient, record: CheckpointRecord
) -> TrainingClient:
    """A training client with the weights and optimizer state of `record`."""
    return await service_client.create_training_client_from_state_with_optimizer(record.state_path)
