"""Datum segments of a whole batch → one padded `DatumBatch` (`assemble_batch`), its boundary
check `check_datum_batch`, and `datum_arrays`.

Conventions:
- A *datum* is one contiguous token sequence `s` of length `n + 1` built from a trajectory's
  turns (see `rlpure.packing._segments` for how). Training is next-token prediction, so the
  datum is stored shifted: position `i` holds input token `s[i]` and predicts target `s[i+1]`;
  every per-token array (`logprobs`, `advantages`, `mask`) is aligned with the targets, i.e. it
  is the full-sequence array minus its first element. `length_D[d] = n`.
- Padding: `[D, T]` arrays are zero beyond `length_D[d]`, with one exception: the inputs and
  targets are two views of one buffer holding each full sequence, so `input_tokens_D_T[d, n]`
  holds the datum's last token `s[n]` (what `target_tokens_D_T[d, n - 1]` predicts; no loss
  reads it). That saves a fifth of the output memory and a copy of it. Padded datum rows (index
  `>= num_datums`) have length 0, every array zero, and `group_idx_D = traj_idx_D = -1`.
  `D` and `T` are rounded up to buckets (`bucket_size`) so a run compiles a handful of times.
- `mask_D_T` is 1.0 on action tokens that train and 0.0 on observation tokens, on action tokens
  of parse-error-masked transitions (metric `parse_error_masked >= 1`) and on padding.
- Packing is host-side numpy (memory movement); maths on the result is `jax.numpy`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import msgspec
import numpy as np

from rlpure.buckets import bucket_size
from rlpure.packing._segments import (
    DatumProvenance,
    Segment,
    single_turn_segment,
    trajectory_segments,
)
from rlpure.records import TrajectoryGroup

__all__ = [
    "DatumBatch",
    "assemble_batch",
    "check_datum_batch",
    "datum_arrays",
]


class DatumBatch(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """A padded batch of datums, ready for a loss or for conversion to `tinker.Datum`s.

    Attributes:
        input_tokens_D_T: int32 `[D, T]` model input tokens (full sequence minus its last); at
            position `length_D[d]` the sequence's last token, beyond it 0 (see the module
            docstring).
        target_tokens_D_T: int32 `[D, T]` targets (full sequence minus its first).
        logprobs_D_T: float32 `[D, T]` sampling logprobs of the targets; 0 on observations.
        advantages_D_T: float32 `[D, T]` advantage of each target; 0 where `mask_D_T` is 0.
        mask_D_T: float32 `[D, T]` 1.0 on trained action tokens, else 0.0.
        length_D: int32 `[D]` number of real positions of each datum (0 for padded rows).
        group_idx_D: int32 `[D]` index of the datum's group in the input (-1 for padding).
        traj_idx_D: int32 `[D]` index of the datum's trajectory within its group (-1 for padding).
        provenance_D: per real datum, where its tokens came from (sampler sequence ids), or
            None; host-side only (dropped from the pytree, so it does not survive `jit`).
        num_datums: number of real datums; rows `>= num_datums` are padding. A Python int on
            the host, a traced int32 scalar inside `jit` (it is data, so a new count in the same
            bucket does not recompile).
    """

    input_tokens_D_T: np.ndarray | jax.Array
    target_tokens_D_T: np.ndarray | jax.Array
    logprobs_D_T: np.ndarray | jax.Array
    advantages_D_T: np.ndarray | jax.Array
    mask_D_T: np.ndarray | jax.Array
    length_D: np.ndarray | jax.Array
    group_idx_D: np.ndarray | jax.Array
    traj_idx_D: np.ndarray | jax.Array
    num_datums: int | np.ndarray | jax.Array
    provenance_D: tuple[DatumProvenance | None, ...] = ()

    @property
    def shape(self) -> tuple[int, int]:
        """The padded `(D, T)`."""
        d, t = self.input_tokens_D_T.shape
        return int(d), int(t)


_ARRAY_FIELDS_D_T = (
    "input_tokens_D_T",
    "target_tokens_D_T",
    "logprobs_D_T",
    "advantages_D_T",
    "mask_D_T",
)
_ARRAY_FIELDS_D = ("length_D", "group_idx_D", "traj_idx_D")

# `num_datums` is a data field (a traced scalar under `jit`), not static metadata: a static
# count would recompile every jitted consumer whenever the number of datums changes, even
# within one (D, T) bucket.
jax.tree_util.register_dataclass(
    DatumBatch,
    data_fields=[*_ARRAY_FIELDS_D_T, *_ARRAY_FIELDS_D, "num_datums"],
    meta_fields=[],
    drop_fields=["provenance_D"],
)


def check_datum_batch(batch: DatumBatch, *, padding: bool = True) -> None:
    """Checks the shapes, dtypes, values and padding contract of a host-side `DatumBatch`.

    Call it at boundaries (e.g. before converting to `tinker.Datum`s or after loading a batch).
    It reads every array once or twice (O(D·T)).

    Args:
        batch: the batch.
        padding: also check that every array is zero beyond each datum's length. Readers that
            only ever slice `[:length]` (like `shell.to_tinker_datums`) can skip this, the most
            expensive part of the check.

    Raises:
        ValueError: naming the field and both shapes, the datum that breaks the padding
            contract, or a field holding negative token ids or non-finite values.
        TypeError: when a token array is not integer or a per-token array not floating point.
    """
    shape = _checked_shape(batch)
    arrays = _checked_arrays(batch)
    _check_datum_rows(batch, arrays, shape)
    if padding:
        _check_zero_padding(arrays, shape)


def _checked_shape(batch: DatumBatch) -> tuple[int, ...]:
    """The batch's `(D, T)`, after checking every field has it (`[D]` ones its first axis)."""
    shape = np.shape(batch.input_tokens_D_T)
    if len(shape) != 2:
        raise ValueError(f"DatumBatch.input_tokens_D_T: expected [D, T], got shape {shape}")
    for name in _ARRAY_FIELDS_D_T:
        got = np.shape(getattr(batch, name))
        if got != shape:
            raise ValueError(f"DatumBatch.{name}: shape mismatch: got {got}, expected {shape}")
    for name in _ARRAY_FIELDS_D:
        got = np.shape(getattr(batch, name))
        if got != shape[:1]:
            raise ValueError(f"DatumBatch.{name}: shape mismatch: got {got}, expected {shape[:1]}")
    return shape


def _checked_arrays(batch: DatumBatch) -> dict[str, np.ndarray]:
    """Field name → the batch's array as numpy, after checking dtypes, token ids and finiteness."""
    arrays = {
        name: np.asarray(getattr(batch, name)) for name in _ARRAY_FIELDS_D_T + _ARRAY_FIELDS_D
    }
    for name in ("input_tokens_D_T", "target_tokens_D_T", *_ARRAY_FIELDS_D):
        if arrays[name].dtype.kind not in "iu":
            raise TypeError(f"DatumBatch.{name}: expected integers, got dtype {arrays[name].dtype}")
    for name in ("input_tokens_D_T", "target_tokens_D_T"):
        if arrays[name].size and arrays[name].min() < 0:
            raise ValueError(f"DatumBatch.{name}: holds negative token ids")
    for name in ("logprobs_D_T", "advantages_D_T", "mask_D_T"):
        if arrays[name].dtype.kind != "f":
            raise TypeError(f"DatumBatch.{name}: expected floats, got dtype {arrays[name].dtype}")
        if not np.all(np.isfinite(arrays[name])):
            raise ValueError(f"DatumBatch.{name}: holds non-finite values")
    return arrays


def _check_datum_rows(
    batch: DatumBatch, arrays: dict[str, np.ndarray], shape: tuple[int, ...]
) -> None:
    """Checks `num_datums`, the real rows' lengths and the padded rows' `[D]` fields."""
    num_datums = int(batch.num_datums)
    if not 0 <= num_datums <= shape[0]:
        raise ValueError(f"DatumBatch.num_datums: {num_datums} outside [0, {shape[0]}]")
    length_D = arrays["length_D"]
    real = slice(0, num_datums)
    if np.any(length_D[real] < 1) or np.any(length_D[real] > shape[1]):
        raise ValueError(f"DatumBatch.length_D: real datums need lengths in [1, {shape[1]}]")
    padded = slice(num_datums, None)
    if (
        np.any(length_D[padded] != 0)
        or np.any(arrays["group_idx_D"][padded] != -1)
        or np.any(arrays["traj_idx_D"][padded] != -1)
    ):
        raise ValueError(
            "DatumBatch: padded rows (index >= num_datums) need length 0 and group/traj index -1"
        )


def _check_zero_padding(arrays: dict[str, np.ndarray], shape: tuple[int, ...]) -> None:
    """Checks every `[D, T]` array is zero beyond each datum's length (see the module docstring)."""
    length_D = arrays["length_D"]
    # The one position beyond a datum's length the inputs may use holds its last token, shared
    # with the targets (or 0, e.g. in a batch built by hand); the zero check starts after it.
    rows = np.flatnonzero((length_D > 0) & (length_D < shape[1]))
    at_length = arrays["input_tokens_D_T"][rows, length_D[rows]]
    last_target = arrays["target_tokens_D_T"][rows, length_D[rows] - 1]
    wrong = (at_length != 0) & (at_length != last_target)
    if np.any(wrong):
        d = int(rows[np.argmax(wrong)])
        raise ValueError(
            f"DatumBatch.input_tokens_D_T: datum {d} holds {int(at_length[np.argmax(wrong)])} "
            f"at its length {int(length_D[d])}; only 0 or its last target token may be there"
        )
    columns_T = np.arange(shape[1])
    for name in _ARRAY_FIELDS_D_T:
        first_zero_D = length_D + (length_D > 0) if name == "input_tokens_D_T" else length_D
        outside_D_T = columns_T[None, :] >= first_zero_D[:, None]
        if np.any(arrays[name][outside_D_T]):
            d = int(np.argmax(np.any(arrays[name] * outside_D_T != 0, axis=1)))
            raise ValueError(
                f"DatumBatch.{name}: datum {d} has non-zero values beyond its length "
                f"{int(length_D[d])}"
            )


def _finite_float32(values: Any, where: str) -> np.ndarray:
    """`values` as a float32 array, refusing non-numeric (or bool) dtypes and non-finite values."""
    arr = np.asarray(values)
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"assemble_batch: {where}: expected real numbers, got dtype {arr.dtype}")
    with np.errstate(over="ignore"):
        out = arr.astype(np.float32)
    if not np.all(np.isfinite(out)):
        bad = np.argwhere(~np.isfinite(out))[0].tolist()
        raise ValueError(
            f"assemble_batch: {where}{bad}: non-finite advantage {arr[tuple(bad)]} (as float32)"
        )
    return out


def _advantage_rows(groups_P: Sequence[TrajectoryGroup], advantages_P: Any) -> list[list[float]]:
    """Reads `advantages_P` (a `[P, G_max]` array or P per-group sequences) as float32 rows."""
    num_groups = len(groups_P)
    if hasattr(advantages_P, "ndim") and advantages_P.ndim == 2:
        adv = _finite_float32(advantages_P, "advantages_P")
        if adv.shape[0] != num_groups:
            raise ValueError(
                f"assemble_batch: advantages_P has {adv.shape[0]} rows, groups_P has {num_groups}"
            )
        rows = []
        for p, group in enumerate(groups_P):
            size = len(group.trajectories_G)
            if size > adv.shape[1]:
                raise ValueError(
                    f"assemble_batch: groups_P[{p}] has {size} trajectories but advantages_P "
                    f"has only {adv.shape[1]} columns"
                )
            rows.append(adv[p, :size].tolist())
        return rows
    if len(advantages_P) != num_groups:
        raise ValueError(
            f"assemble_batch: advantages_P has {len(advantages_P)} entries, "
            f"groups_P has {num_groups}"
        )
    rows = []
    for p, (group, adv_G) in enumerate(zip(groups_P, advantages_P, strict=True)):
        adv_row = _finite_float32(adv_G, f"advantages_P[{p}]")
        if adv_row.shape != (len(group.trajectories_G),):
            raise ValueError(
                f"assemble_batch: advantages_P[{p}] has shape {adv_row.shape}, "
                f"groups_P[{p}] has {len(group.trajectories_G)} trajectories"
            )
        rows.append(adv_row.tolist())
    return rows


def assemble_batch(
    groups_P: Sequence[TrajectoryGroup],
    advantages_P: Any,
    *,
    min_datums: int = 8,
    min_tokens: int = 16,
    bucket: bool = True,
    _alloc: Callable[[tuple[int, ...], type[np.float32]], np.ndarray] = np.empty,
) -> DatumBatch:
    """Assembles every trajectory of every group into one padded `DatumBatch`.

    Datums come in the cookbook's order (group by group, trajectory by trajectory, segment by
    segment); see `trajectory_segments` for how a trajectory becomes datums. Each datum's full
    sequence `s` (length `L + 1`) is stored shifted: `input_tokens[d, :L] = s[:-1]`,
    `target_tokens[d, :L] = s[1:]`, and logprobs/advantages/mask are the per-token arrays of `s`
    minus their first element.

    Args:
        groups_P: the groups, `P` of them, ragged sizes allowed.
        advantages_P: the trajectories' advantages: a float32 `[P, G_max]` array (e.g. from
            `compute_advantages`; columns beyond a group's size are ignored) or `P` sequences of
            length `G_p`.
        min_datums: smallest padded `D`.
        min_tokens: smallest padded `T`.
        bucket: round `D` and `T` up to `bucket_size` buckets (else pad to `min_*` only).
        _alloc: private, for tests: allocates the uninitialised output block, as `np.empty`
            (a test passes one that returns memory full of NaNs to show no stale value leaks).

    Returns:
        The padded batch; `num_datums` real rows, the rest padding.

    Raises:
        ValueError: naming the group/trajectory/transition for missing logprobs, datums shorter
            than 2 tokens, or advantages whose shape does not match the groups.

    Examples:
        >>> from rlpure.records import *
        >>> t = Transition(ob=ModelInput.from_ints([1, 2, 3]),
        ...     ac=TokensWithLogprobs(tokens=[10, 11, 12], logprobs=[-1.0, -1.0, -1.0]),
        ...     reward=1.0, episode_done=True)
        >>> g = TrajectoryGroup(trajectories_G=(Trajectory(transitions=(t,)),),
        ...     final_rewards_G=(0.0,), metrics_G=({},))
        >>> b = assemble_batch([g], [[0.5]])
        >>> b.mask_D_T[0, : b.length_D[0]].tolist()
        [0.0, 0.0, 1.0, 1.0, 1.0]
    """
    rows = _advantage_rows(groups_P, advantages_P)
    segments: list[Segment] = []
    group_idx: list[int] = []
    traj_idx: list[int] = []
    for p, (group, adv_row) in enumerate(zip(groups_P, rows, strict=True)):
        for g, (traj, adv) in enumerate(zip(group.trajectories_G, adv_row, strict=True)):
            transitions = traj.transitions
            if len(transitions) == 1:  # the common case: at most one datum, no repeat lists
                segment = single_turn_segment(transitions[0], adv, (p, g))
                if segment is not None:
                    segments.append(segment)
                    group_idx.append(p)
                    traj_idx.append(g)
                continue
            found = trajectory_segments(traj, adv, where=(p, g))
            segments.extend(found)
            group_idx.extend([p] * len(found))
            traj_idx.extend([g] * len(found))
    return _pack_segments(
        segments,
        group_idx,
        traj_idx,
        min_datums=min_datums,
        min_tokens=min_tokens,
        bucket=bucket,
        alloc=_alloc,
    )


def _pack_segments(
    segments: list[Segment],
    group_idx: list[int],
    traj_idx: list[int],
    *,
    min_datums: int,
    min_tokens: int,
    bucket: bool,
    alloc: Callable[[tuple[int, ...], type[np.float32]], np.ndarray],
) -> DatumBatch:
    """Packs `segments` (with each one's group and trajectory index) into a read-only batch."""
    num_datums = len(segments)
    lengths = [segment.full_length - 1 for segment in segments]
    length_max = max(lengths, default=0)
    if bucket:
        d_pad = bucket_size(num_datums, minimum=min_datums)
        t_pad = bucket_size(length_max, minimum=min_tokens)
    else:
        d_pad, t_pad = max(num_datums, min_datums), max(length_max, min_tokens)
    # Unshifted per-sequence arrays with one extra column: the inputs are their first `t_pad`
    # columns and the targets and per-token arrays their last `t_pad`, so each piece is written
    # once (a separate, zero-padded input array cost 20% more memory and ~10% more time).
    width = t_pad + 1
    # One uninitialised block for all four arrays, viewed per dtype, in which every visible
    # position is written exactly once. Zeroing it first (np.zeros) cost a whole extra pass over
    # the output, a quarter of the time on the GRPO benchmark batch.
    block = alloc((4, d_pad * width), np.float32)
    tokens = block[0].view(np.int32)
    logprobs, advantages, mask = block[1], block[2], block[3]
    _write_segments(segments, tokens, logprobs, advantages, mask, width=width)
    tokens = tokens.reshape(d_pad, width)
    logprobs = logprobs.reshape(d_pad, width)
    advantages = advantages.reshape(d_pad, width)
    mask = mask.reshape(d_pad, width)
    length_D = np.zeros(d_pad, np.int32)
    length_D[:num_datums] = lengths
    input_tokens = tokens[:, :t_pad]
    group_idx_D = np.full(d_pad, -1, np.int32)
    group_idx_D[:num_datums] = group_idx
    traj_idx_D = np.full(d_pad, -1, np.int32)
    traj_idx_D[:num_datums] = traj_idx
    for array in (
        tokens,
        logprobs,
        advantages,
        mask,
        input_tokens,
        length_D,
        group_idx_D,
        traj_idx_D,
    ):
        array.flags.writeable = False  # the batch is immutable, like the records it came from
    return DatumBatch(
        input_tokens_D_T=input_tokens,
        target_tokens_D_T=tokens[:, 1:],
        logprobs_D_T=logprobs[:, 1:],
        advantages_D_T=advantages[:, 1:],
        mask_D_T=mask[:, 1:],
        length_D=length_D,
        group_idx_D=group_idx_D,
        traj_idx_D=traj_idx_D,
        num_datums=num_datums,
        provenance_D=tuple([segment.provenance for segment in segments]),
    )


def _write_segments(
    segments: list[Segment],
    tokens: np.ndarray,
    logprobs: np.ndarray,
    advantages: np.ndarray,
    mask: np.ndarray,
    *,
    width: int,
) -> None:
    """Writes every position of the flat, uninitialised `[D * (T + 1)]` arrays exactly once.

    Row `d` (flat positions `d * width` on) holds segment `d`'s full, unshifted sequence, then
    zeros; rows beyond the segments are all zero. `tokens` is int32, the others float32.

    Token rows are written piece by piece plus a zero tail per row. The other arrays are
    non-zero only on action pieces (logprobs) or on trained action pieces (advantages, mask), so
    each such piece is preceded by one zero write covering everything since the previous one
    (the previous row's tail and this row's observation tokens together), and the rest is
    zeroed at the end.
    """
    # Copies go through flat memoryviews: same bytes, a third of the per-slice overhead of
    # ndarray __setitem__, and no per-row view objects (the loop runs a few thousand small
    # copies; their Python overhead is most of its time). Zeros and ones come from buffers.
    tokens_mv, logprobs_mv, advantages_mv, mask_mv = (
        tokens.data,
        logprobs.data,
        advantages.data,
        mask.data,
    )
    zeros_limit = 2 * width  # a gap spans at most a tail and an observation, unless a datum
    zeros_mv = np.zeros(zeros_limit, np.float32).data  # has no action (then: ndarray fill)
    int_zeros_mv = np.zeros(width, np.int32).data
    ones_mv = np.ones(width, np.float32).data
    logprobs_done = trained_done = 0  # flat positions up to which the arrays are written
    for d, (full_length, pieces, _) in enumerate(segments):
        row = d * width
        for offset, piece_tokens, piece_logprobs, adv, m in pieces:
            start = row + offset
            n = len(piece_tokens)
            end = start + n
            tokens_mv[start:end] = piece_tokens.data
            if piece_logprobs is None:
                continue
            gap = start - logprobs_done
            if gap <= zeros_limit:
                logprobs_mv[logprobs_done:start] = zeros_mv[:gap]
            else:
                logprobs[logprobs_done:start] = 0.0
            logprobs_mv[start:end] = piece_logprobs.data
            logprobs_done = end
            if m:
                gap = start - trained_done
                if gap <= zeros_limit:
                    advantages_mv[trained_done:start] = zeros_mv[:gap]
                    mask_mv[trained_done:start] = zeros_mv[:gap]
                else:
                    advantages[trained_done:start] = 0.0
                    mask[trained_done:start] = 0.0
                advantages[start:end].fill(adv)  # a tenth faster than slice assignment
                mask_mv[start:end] = ones_mv[:n]
                trained_done = end
        tokens_mv[row + full_length : row + width] = int_zeros_mv[: width - full_length]
    tokens[len(segments) * width :] = 0
    logprobs[logprobs_done:] = 0.0
    advantages[trained_done:] = 0.0
    mask[trained_done:] = 0.0


def datum_arrays(batch: DatumBatch, d: int) -> dict[str, np.ndarray]:
    """The unpadded arrays of datum `d` (numpy views; no copy for numpy batches)."""
    if not 0 <= d < int(batch.num_datums):
        raise IndexError(f"datum_arrays: datum {d} outside [0, {batch.num_datums})")
    length = int(batch.length_D[d])
    return {
        "input_tokens": np.asarray(batch.input_tokens_D_T[d, :length]),
        "target_tokens": np.asarray(batch.target_tokens_D_T[d, :length]),
        "logprobs": np.asarray(batch.logprobs_D_T[d, :length]),
        "advantages": np.asarray(batch.advantages_D_T[d, :length]),
        "mask": np.asarray(batch.mask_D_T[d, :length]),
    }
