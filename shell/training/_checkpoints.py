"""`checkpoints.jsonl`: the checkpoint row format, read and written.

Conventions:
- A `CheckpointRecord` is written **after** the backend confirmed `save_state`, as one JSON line
  appended to `<log_dir>/checkpoints.jsonl` and fsynced, so a record always names a state that
  exists. `step` is the number of completed training steps, i.e. the index of the next step to
  run; `rng_key_data` is the loop's jax PRNG key data after those steps (`prng_key_data`), so a
  resumed run draws the same per-step seeds as an uninterrupted one. When rows are saved is
  `shell.training._saves`; resuming from the last one is `shell.training._resume`.
- A torn last line (a kill during the append) is ignored with a warning; any other unreadable
  line raises `CheckpointError` naming the file and line.
- Records hold paths and numbers only: never credentials.
- Log directories are relocatable: a state the backend saved inside the log dir (the local
  backend's `<log_dir>/local_states/...`) gets its path relative to the log dir in the
  row's extra key `relative_state_path` (`local_states/local-0-0/state/step_000004_...`;
  likewise `relative_sampler_path`), and `load_checkpoints` resolves that against the log dir
  it reads, so `mv D D2` keeps every record usable. The cookbook's keys `state_path` /
  `sampler_path` hold what the backend returned (an absolute path, as the cookbook writes), so
  the cookbook's `main` resumes the log dir where it is; a URI (`tinker://...`, `fake://...`)
  is the service's name for a state and is written as it is, with no relative key. A state saved
  outside the log dir (the local backend's default store, as `LocalServiceClient()` keeps its
  states) gets no relative key and marks its row `outside_log_dir` (with a warning: that log dir
  resumes only where that state is); such a row's absolute paths are read as they are, as a
  URI is. Reading refuses any other rlpure record whose path lies outside the log dir it is
  read from — a relative path climbing out with `..`, or an unmarked absolute one such as the
  records of an rlpure that wrote absolute paths into its own log dir, moved since — with a
  `CheckpointError` saying how to fix it.
- Rows are the cookbook's (tinker-cookbook 0.6.1 `checkpoint_utils`): each line rlpure writes
  carries the cookbook's keys `name` (`"000020"`: the batch, six digits; `"final"` for the end
  of the run), `batch` (the next batch to train), `state_path`, `sampler_path` (periodic and
  final rows), `rolling` (rolling rows only) and the running token totals `cumulative_tokens` /
  `discarded_tokens` (`{kind: count}` over `rlpure.usage.TOKEN_KINDS`, which the cookbook's
  `main` reads back as its `TokenUsage`; the final row holds the run's end totals), so the
  cookbook's `get_last_checkpoint` / `load_checkpoints_file` / `main` read an rlpure log dir;
  plus rlpure's own as extra keys: `step` (= `batch`, kept for readers of older rows),
  `rng_key_data`, `final`, `wall_time`, `kl_reference_path` (relative to the log dir when
  inside it: only rlpure reads it) and the `relative_*` paths. The state itself is saved under
  a unique name (`step_000020_<hex>`, visible in `state_path`) so that saving a step twice never
  collides.
- Reading accepts, told apart per line: rlpure's rows of every version of this project —
  (a) the first ones, `step`/`name`/`state_path`/`rng_key_data`/`final`/`wall_time`/
  `kl_reference_path` with absolute paths, which resume while they point inside the log dir
  they are read from (else the error gives the `sed` line that converts them); (b) the same
  with paths relative to the log dir; (c) (b) plus the cookbook's `batch` and token totals;
  (d) today's, (c) plus `sampler_path`, `rolling` and the `relative_*` paths — and rows the
  cookbook's `rl.train.main` / `save_checkpoint_async` wrote (`name`, `batch`, `state_path`, no
  `step` nor `rng_key_data`). Such a row resumes at `batch`, and what it lacks is re-derived or
  lost: the loop's PRNG key is re-derived from the run's seed by replaying one
  `jax.random.split` per completed step (`rederived_key_data`, the key an uninterrupted rlpure
  run with that seed holds there; the record says `rng_key_rederived`, and `last_checkpoint`
  logs it), there is no KL reference to carry over (a run with a KL penalty makes a new one
  from the resumed weights), and its epoch is not read. The token totals of every kind of row
  are read (a row without them, as older rlpure rows, resumes its totals from zero, as the
  cookbook's `main` does). A cookbook row may name a state outside the log dir (the cookbook
  records absolute paths), which is its own semantics; it is still refused if the state is
  missing (`check_states_exist`). A row with no `state_path` (a cookbook sampler-only save) is
  skipped, as the cookbook's `get_last_checkpoint` skips it. Any other row is refused with a
  `CheckpointError` naming the file, the line and the missing key. The last row is the latest
  save, periodic, rolling or final alike, which is what both `last_checkpoint` and the
  cookbook's `get_last_checkpoint` resume.
- Rows as plain JSON objects, for code that writes its own keys (a cookbook recipe's
  `save_checkpoint(loop_state=...)`): `read_checkpoint_rows` returns every row as written,
  `append_checkpoint_row` appends one as given (no check, no path rewriting).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Annotated, Any

import jax
import jax.numpy as jnp
import msgspec
import numpy as np

from rlpure.usage import TokenUsage
from shell.errors import CheckpointError

__all__ = [
    "CHECKPOINTS_FILE",
    "CheckpointRecord",
    "append_checkpoint",
    "append_checkpoint_row",
    "checkpoint_name",
    "is_uri",
    "load_checkpoints",
    "prng_key_data",
    "prng_key_from_data",
    "read_checkpoint_rows",
    "recorded_path",
    "rederived_key_data",
    "resolved_path",
]

logger = logging.getLogger(__name__)

CHECKPOINTS_FILE = "checkpoints.jsonl"
"""One `CheckpointRecord` per saved state, in the log dir."""


class CheckpointRecord(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """One line of `checkpoints.jsonl`.

    Attributes:
        step: completed training steps (the next step index to run), >= 0.
        name: the cookbook's name of the row (`"000020"`, `"final"`; see `checkpoint_name`).
        state_path: the path the backend returned (e.g. `tinker://...` or a directory); read
            back resolved against the log dir (see the module docstring).
        rng_key_data: uint32 words of the loop's jax PRNG key after `step` steps.
        final: whether the run ended here.
        wall_time: unix time of the save.
        kl_reference_path: sampler weights of the KL reference saved at the start of the run
            (None when the run has no KL penalty or names a reference model).
        rng_key_rederived: the row held no PRNG key (the cookbook wrote it) and `rng_key_data`
            was re-derived from the seed (`rederived_key_data`); never written to the file.
        cumulative_tokens: the run's running token totals after `step` steps, discarded
            sampling included (`rlpure.usage`; zero when the row has none).
        discarded_tokens: the part of `cumulative_tokens` sampled for groups dropped before
            training.
        sampler_path: the sampler weights saved with the state (periodic and final saves), or
            None (a rolling save, or a row written before rlpure saved them).
        rolling: a rolling save (state only, deleted once a newer one is saved).
    """

    step: int
    name: str
    state_path: str
    rng_key_data: tuple[Annotated[int, msgspec.Meta(ge=0, lt=2**32)], ...]
    final: bool = False
    wall_time: float = 0.0
    kl_reference_path: str | None = None
    rng_key_rederived: bool = False
    cumulative_tokens: TokenUsage = msgspec.field(default_factory=TokenUsage)
    discarded_tokens: TokenUsage = msgspec.field(default_factory=TokenUsage)
    sampler_path: str | None = None
    rolling: bool = False

    def __post_init__(self) -> None:
        if self.step < 0:
            raise ValueError(f"CheckpointRecord.step: expected >= 0, got {self.step}")
        if not self.state_path:
            raise ValueError("CheckpointRecord.state_path: empty")


class _Row(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """One line of `checkpoints.jsonl` as written by rlpure (any version) or the cookbook."""

    name: str | None = None
    batch: int | None = None
    step: int | None = None
    state_path: str | None = None
    sampler_path: str | None = None
    rng_key_data: tuple[Annotated[int, msgspec.Meta(ge=0, lt=2**32)], ...] | None = None
    final: bool | None = None
    wall_time: float | None = None
    kl_reference_path: str | None = None
    cumulative_tokens: dict[str, int] | None = None
    discarded_tokens: dict[str, int] | None = None
    rolling: bool | None = None
    relative_state_path: str | None = None
    relative_sampler_path: str | None = None
    outside_log_dir: bool | None = None


class _WrittenRow(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The line rlpure writes: the cookbook's keys first, then rlpure's; an optional key whose
    value is None (or `rolling` false) is left out, as the cookbook's `CheckpointRecord.to_dict`
    does."""

    name: str
    batch: int
    state_path: str
    sampler_path: str | None = None
    rolling: bool | None = None
    cumulative_tokens: dict[str, int]
    discarded_tokens: dict[str, int]
    step: int
    rng_key_data: tuple[int, ...]
    final: bool
    wall_time: float
    kl_reference_path: str | None  # always written (null: none), as in every earlier row
    relative_state_path: str | None = None
    relative_sampler_path: str | None = None
    outside_log_dir: bool | None = None


_DECODER = msgspec.json.Decoder(_Row)
_ENCODER = msgspec.json.Encoder()


def checkpoint_name(step: int, *, final: bool = False) -> str:
    """The cookbook's name for a checkpoint row.

    Examples:
        >>> checkpoint_name(20), checkpoint_name(20, final=True)
        ('000020', 'final')
    """
    return "final" if final else f"{step:06d}"


@cache
def _advance() -> Any:
    def advance(data: jax.Array, steps: jax.Array) -> jax.Array:
        def one(_: Any, words: jax.Array) -> jax.Array:
            return jax.random.key_data(jax.random.split(jax.random.wrap_key_data(words))[0])

        advanced: jax.Array = jax.lax.fori_loop(0, steps, one, data)
        return advanced

    return jax.jit(advance)


@cache
def rederived_key_data(seed: int, steps: int) -> tuple[int, ...]:
    """The loop's PRNG key data after `steps` steps of a run seeded with `seed`.

    The loop starts from `jax.random.key(seed)` and splits its key once per step, keeping the
    first half; this replays that, for a row that holds no key (the cookbook's).

    Examples:
        >>> rederived_key_data(0, 0) == tuple(
        ...     int(x) for x in np.asarray(jax.random.key_data(jax.random.key(0)))
        ... )
        True
    """
    start = jax.random.key_data(jax.random.key(seed))
    data = _advance()(start, jnp.asarray(steps, dtype=jnp.int32))
    return tuple(int(x) for x in np.asarray(data).ravel())


_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
"""A service's name for a state (`tinker://...`): not a path of this machine."""


def is_uri(path: str) -> bool:
    return _URI.match(path) is not None


_WARNED_OUTSIDE: set[Path] = set()
"""Log dirs already warned about states saved outside them (one warning per run, not per save)."""


def recorded_path(path: str, log_dir: str | os.PathLike[str], *, warn: bool = True) -> str:
    """How a record stores the backend's `path`: relative to `log_dir` when inside it.

    Examples:
        >>> recorded_path("/runs/a/local_states/m/state/s", "/runs/a")
        'local_states/m/state/s'
        >>> recorded_path("tinker://run-1/weights/s", "/runs/a")
        'tinker://run-1/weights/s'
    """
    if is_uri(path):
        return path
    absolute = Path(os.path.abspath(path))
    root = Path(os.path.abspath(log_dir))
    if absolute.is_relative_to(root):
        return absolute.relative_to(root).as_posix()
    # compare resolved paths too: a log dir reached through a symlink
    if absolute.resolve().is_relative_to(root.resolve()):
        return absolute.resolve().relative_to(root.resolve()).as_posix()
    if warn and root not in _WARNED_OUTSIDE:
        _WARNED_OUTSIDE.add(root)
        logger.warning(
            "%s: the state %s is saved outside this log dir, so the log dir resumes only on a "
            "machine where that state is, and not at all once it is gone (a LocalServiceClient "
            "with temporary_checkpoints=True deletes its states at exit; the local backend "
            "keeps states inside the log dir with "
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


def resolved_path(stored: str, log_dir: Path, *, where: str, outside_ok: bool = False) -> str:
    """The path a record's `stored` path names, read from `log_dir` (URIs as they are; an
    absolute path outside `log_dir` as it is when `outside_ok`: a row marked
    `outside_log_dir`, its states saved there on purpose).

    Raises:
        CheckpointError: `stored` lies outside `log_dir` (message says how to fix it).
    """
    if is_uri(stored):
        return stored
    # Lexical containment, not `resolve()`: a `local_states` that is a symlink to another disk
    # stays inside the log dir as far as its records go.
    root = Path(os.path.abspath(log_dir))
    path = Path(stored)
    if not path.is_absolute() and ".." not in path.parts:
        return str(root / path)
    target = Path(os.path.normpath(path)) if path.is_absolute() else None
    if target is not None and (
        outside_ok or target.is_relative_to(root) or target.resolve().is_relative_to(root.resolve())
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


def load_checkpoints(log_dir: str | os.PathLike[str], *, seed: int = 0) -> list[CheckpointRecord]:
    """All checkpoint records of a log directory, oldest first (none: empty list), their paths
    resolved against `log_dir` (absolute paths; URIs as recorded).

    Args:
        log_dir: the run's log directory.
        seed: the run's seed (`TrainConfig.seed`), from which a row without a PRNG key (the
            cookbook's) gets its key re-derived (see the module docstring).

    Raises:
        CheckpointError: a line other than the last cannot be decoded, is neither rlpure's
            row nor the cookbook's, or names a state outside `log_dir` (see the module
            docstring).
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
            row = _DECODER.decode(line)
        except msgspec.DecodeError as err:
            if number == len(lines) and not data.endswith(b"\n"):
                logger.warning("%s: ignoring torn last line %d (%s)", path, number, err)
                break
            raise CheckpointError(f"{path}: line {number}: {err}") from None
        record = _record(row, where=f"{path}: line {number}", log_dir=path.parent, seed=seed)
        if record is not None:
            records.append(record)
    return records


def _record(row: _Row, *, where: str, log_dir: Path, seed: int) -> CheckpointRecord | None:
    """The record a decoded row holds (None: a cookbook sampler-only row, skipped)."""
    ours = row.step is not None or row.rng_key_data is not None
    if ours:
        missing = [key for key in ("step", "rng_key_data", "name", "state_path")
                   if getattr(row, key) is None]  # fmt: skip
        if missing:
            raise CheckpointError(
                f"{where}: an rlpure checkpoint row without {', '.join(map(repr, missing))}"
            )
        assert row.step is not None and row.rng_key_data is not None  # for mypy
        if row.batch is not None and row.batch != row.step:
            raise CheckpointError(
                f"{where}: 'batch' {row.batch} and 'step' {row.step} disagree (both name the "
                "next step to train)"
            )
        if len(row.rng_key_data) != _key_words():
            raise CheckpointError(
                f"{where}: field 'rng_key_data': expected {_key_words()} uint32 words (the "
                f"loop's jax PRNG key), got {len(row.rng_key_data)}"
            )
        step, key_data, rederived = row.step, row.rng_key_data, False
    else:
        if row.name is not None and row.state_path is None and row.sampler_path is not None:
            return None  # the cookbook's sampler-only row: nothing to resume
        missing = [key for key in ("name", "batch", "state_path") if getattr(row, key) is None]
        if missing:
            raise CheckpointError(
                f"{where}: neither an rlpure checkpoint row ('step', 'rng_key_data') nor the "
                f"cookbook's ('name', 'batch', 'state_path'): no {', '.join(map(repr, missing))}"
            )
        assert row.batch is not None  # for mypy
        step, key_data, rederived = row.batch, rederived_key_data(seed, row.batch), True
    assert row.name is not None and row.state_path is not None  # for mypy
    outside_ok = bool(row.outside_log_dir)
    if not row.state_path:
        raise CheckpointError(f"{where}: 'state_path' is empty")
    if step < 0:
        raise CheckpointError(f"{where}: expected a step >= 0, got {step}")
    if rederived:
        # the cookbook's semantics: an absolute path, anywhere (a relative one is resolved
        # against the log dir, where rlpure's older rows kept theirs)
        def read(path: str | None) -> str | None:
            if path is None or Path(path).is_absolute():
                return path
            return resolved_path(path, log_dir, where=where)

        state_path, sampler_path = read(row.state_path), read(row.sampler_path)
    else:
        # a row with relative keys names its states by them (its absolute `state_path` is
        # where the log dir was written, for the cookbook); older rows by `state_path` itself
        def ours_read(relative: str | None, path: str | None) -> str | None:
            stored = relative if relative is not None else path
            if stored is None:
                return None
            return resolved_path(stored, log_dir, where=where, outside_ok=outside_ok)

        state_path = ours_read(row.relative_state_path, row.state_path)
        sampler_path = ours_read(row.relative_sampler_path, row.sampler_path)
    assert state_path is not None  # for mypy
    return CheckpointRecord(
        step=step,
        name=row.name,
        state_path=state_path,
        rng_key_data=key_data,
        # the cookbook marks its final row by its name only
        final=bool(row.final) or (rederived and row.name == "final"),
        wall_time=0.0 if row.wall_time is None else row.wall_time,
        kl_reference_path=(
            None
            if row.kl_reference_path is None
            else resolved_path(row.kl_reference_path, log_dir, where=where, outside_ok=outside_ok)
        ),
        rng_key_rederived=rederived,
        cumulative_tokens=_token_totals(
            row.cumulative_tokens, where=f"{where}: 'cumulative_tokens'"
        ),
        discarded_tokens=_token_totals(row.discarded_tokens, where=f"{where}: 'discarded_tokens'"),
        sampler_path=sampler_path,
        rolling=bool(row.rolling),
    )


def _token_totals(counts: dict[str, int] | None, *, where: str) -> TokenUsage:
    try:
        return TokenUsage.from_mapping(counts, where=where)
    except ValueError as error:
        raise CheckpointError(str(error)) from None


def _as_written(path: str) -> str:
    """A backend's path as the cookbook's keys hold it: a URI as it is, a path made absolute."""
    return path if is_uri(path) else os.path.abspath(path)


def _relative(path: str | None, log_dir: str | os.PathLike[str]) -> str | None:
    """`path` relative to `log_dir` when inside it, else None (URIs, outside: warned once)."""
    if path is None:
        return None
    stored = recorded_path(path, log_dir)
    return None if is_uri(stored) or Path(stored).is_absolute() else stored


def _written_row(record: CheckpointRecord, log_dir: str | os.PathLike[str]) -> _WrittenRow:
    return _WrittenRow(
        name=record.name,
        batch=record.step,
        state_path=_as_written(record.state_path),
        sampler_path=None if record.sampler_path is None else _as_written(record.sampler_path),
        rolling=True if record.rolling else None,
        cumulative_tokens=record.cumulative_tokens.as_dict(),
        discarded_tokens=record.discarded_tokens.as_dict(),
        step=record.step,
        rng_key_data=record.rng_key_data,
        final=record.final,
        wall_time=record.wall_time,
        kl_reference_path=(
            None
            if record.kl_reference_path is None
            else recorded_path(record.kl_reference_path, log_dir)
        ),
        relative_state_path=_relative(record.state_path, log_dir),
        relative_sampler_path=_relative(record.sampler_path, log_dir),
        outside_log_dir=True
        if any(
            _outside(path, log_dir)
            for path in (record.state_path, record.sampler_path, record.kl_reference_path)
        )
        else None,
    )


def _outside(path: str | None, log_dir: str | os.PathLike[str]) -> bool:
    """Whether `path` is a filesystem path outside `log_dir` (a URI is not)."""
    return path is not None and Path(recorded_path(path, log_dir, warn=False)).is_absolute()


def append_checkpoint(log_dir: str | os.PathLike[str], record: CheckpointRecord) -> None:
    """Appends `record` to `<log_dir>/checkpoints.jsonl` and fsyncs it.

    The row holds `record`'s paths as the module docstring says: the cookbook's keys the
    backend's paths (absolute), the `relative_*` keys and `kl_reference_path` relative to
    `log_dir` when inside it.
    """
    _append_line(Path(log_dir) / CHECKPOINTS_FILE, _ENCODER.encode(_written_row(record, log_dir)))


def _append_line(path: Path, line: bytes) -> None:
    """Appends `line` and a newline to `path` and fsyncs it, after cutting a torn last line."""
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
        f.write(line + b"\n")
        f.flush()
        os.fsync(f.fileno())


# --- rows as plain JSON objects (what cookbook code reads and writes) --------------------------


def read_checkpoint_rows(log_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every row of `<log_dir>/checkpoints.jsonl` as the JSON object it is, oldest first (no
    file: an empty list), whoever wrote it: rlpure (with its own keys), the cookbook, or a
    recipe's loop (`name` plus its `loop_state` keys). Nothing is checked nor resolved: what
    the cookbook's `checkpoint_utils.load_checkpoints_file` reads, for code that keeps its own
    keys. Resuming an rlpure run reads `load_checkpoints` instead.

    A torn last line (a kill during the append) is ignored with a warning, as
    `load_checkpoints` does.

    Raises:
        CheckpointError: a line other than the last is not JSON, or a line is not a JSON
            object (naming the file and line).
    """
    path = Path(log_dir) / CHECKPOINTS_FILE
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.splitlines()
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:  # JSONDecodeError, or bytes that are not UTF-8
            if number == len(lines) and not data.endswith(b"\n"):
                logger.warning("%s: ignoring torn last line %d (%s)", path, number, err)
                break
            raise CheckpointError(f"{path}: line {number}: not JSON ({err})") from None
        if not isinstance(row, dict):
            raise CheckpointError(
                f"{path}: line {number}: expected a JSON object, got {type(row).__name__}"
            )
        rows.append(row)
    return rows


def append_checkpoint_row(log_dir: str | os.PathLike[str], row: Mapping[str, Any]) -> None:
    """Appends `row` to `<log_dir>/checkpoints.jsonl` as one JSON line, as it is (the
    cookbook's `json.dumps` line, so the same bytes its `save_checkpoint` writes), fsynced,
    after cutting a torn last line (see `append_checkpoint`).

    Raises:
        TypeError: a value JSON cannot hold (as `json.dumps`).
    """
    _append_line(Path(log_dir) / CHECKPOINTS_FILE, json.dumps(dict(row)).encode("utf-8"))


# --- the PRNG key in a checkpoint record -------------------------------------------------------


def prng_key_data(key: jax.Array) -> tuple[int, ...]:
    """The uint32 words of a typed jax PRNG key, flattened (`CheckpointRecord.rng_key_data`).

    Examples:
        >>> data = prng_key_data(jax.random.key(0))
        >>> prng_key_data(prng_key_from_data(data)) == data
        True
    """
    return tuple(int(x) for x in np.asarray(jax.random.key_data(key)).ravel())


def prng_key_from_data(data: Sequence[int]) -> jax.Array:
    """The typed jax PRNG key whose words `prng_key_data` returned."""
    key: jax.Array = jax.random.wrap_key_data(jnp.asarray(data, jnp.uint32))
    return key
