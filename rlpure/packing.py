"""Trajectories → datums → one padded batch (the cookbook's `trajectory_to_data`, vectorised).

Conventions:
- A *datum* is one contiguous token sequence `s` of length `L + 1` built from a trajectory's
  turns (see `trajectory_to_data` semantics below). Training is next-token prediction, so the
  datum is stored shifted: position `i` holds input token `s[i]` and predicts target `s[i+1]`;
  every per-token array (`logprobs`, `advantages`, `mask`) is aligned with the targets, i.e. it
  is the full-sequence array minus its first element. `length_D[d] = L`.
- Padding: `[D, T]` arrays are zero beyond `length_D[d]`; padded datum rows (index
  `>= num_datums`) have length 0, every array zero, and `group_idx_D = traj_idx_D = -1`.
  `D` and `T` are rounded up to buckets (`bucket_size`) so a run compiles a handful of times.
- `mask_D_T` is 1.0 on action tokens that train and 0.0 on observation tokens, on action tokens
  of parse-error-masked transitions (metric `parse_error_masked >= 1`) and on padding.
- Packing is host-side numpy (memory movement); maths on the result is `jax.numpy`.
"""

from __future__ import annotations

import jax
import msgspec
import numpy as np

__all__ = ["DatumBatch", "check_datum_batch"]


class DatumBatch(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """A padded batch of datums, ready for a loss or for conversion to `tinker.Datum`s.

    Attributes:
        input_tokens_D_T: int32 `[D, T]` model input tokens (full sequence minus its last).
        target_tokens_D_T: int32 `[D, T]` targets (full sequence minus its first).
        logprobs_D_T: float32 `[D, T]` sampling logprobs of the targets; 0 on observations.
        advantages_D_T: float32 `[D, T]` advantage of each target; 0 where `mask_D_T` is 0.
        mask_D_T: float32 `[D, T]` 1.0 on trained action tokens, else 0.0.
        length_D: int32 `[D]` number of real positions of each datum (0 for padded rows).
        group_idx_D: int32 `[D]` index of the datum's group in the input (-1 for padding).
        traj_idx_D: int32 `[D]` index of the datum's trajectory within its group (-1 for padding).
        num_datums: number of real datums (static under `jit`); rows `>= num_datums` are padding.
    """

    input_tokens_D_T: np.ndarray | jax.Array
    target_tokens_D_T: np.ndarray | jax.Array
    logprobs_D_T: np.ndarray | jax.Array
    advantages_D_T: np.ndarray | jax.Array
    mask_D_T: np.ndarray | jax.Array
    length_D: np.ndarray | jax.Array
    group_idx_D: np.ndarray | jax.Array
    traj_idx_D: np.ndarray | jax.Array
    num_datums: int

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

jax.tree_util.register_dataclass(
    DatumBatch,
    data_fields=[*_ARRAY_FIELDS_D_T, *_ARRAY_FIELDS_D],
    meta_fields=["num_datums"],
)


def check_datum_batch(batch: DatumBatch) -> None:
    """Checks shapes and the padding contract of a `DatumBatch` (call at boundaries).

    Raises:
        ValueError: naming the field and both shapes when they disagree.
    """
    shape = batch.input_tokens_D_T.shape
    if len(shape) != 2:
        raise ValueError(f"DatumBatch.input_tokens_D_T: expected [D, T], got shape {shape}")
    for name in _ARRAY_FIELDS_D_T:
        got = getattr(batch, name).shape
        if got != shape:
            raise ValueError(f"DatumBatch.{name}: shape mismatch: got {got}, expected {shape}")
    for name in _ARRAY_FIELDS_D:
        got = getattr(batch, name).shape
        if got != shape[:1]:
            raise ValueError(f"DatumBatch.{name}: shape mismatch: got {got}, expected {shape[:1]}")
    if not 0 <= batch.num_datums <= shape[0]:
        raise ValueError(f"DatumBatch.num_datums: {batch.num_datums} outside [0, {shape[0]}]")
    length_D = np.asarray(batch.length_D)
    if np.any(length_D < 0) or np.any(length_D > shape[1]):
        raise ValueError(f"DatumBatch.length_D: values must lie in [0, {shape[1]}]")
