"""Trajectories → datums → one padded batch: the cookbook's `trajectory_to_data` and
`assemble_training_data`, vectorised.

- `_segments`: how a trajectory's turns become datum segments (prefix merging, masks,
  provenance spans): `trajectory_segments`, `ProvenanceSpan`, `DatumProvenance`.
- `_assembly`: segments of a whole batch → `DatumBatch`, bucketed padded `[D, T]` arrays
  (`assemble_batch`), the boundary check `check_datum_batch` and `datum_arrays`.

Each part's docstring states its conventions (alignment, masks, padding).
"""

from __future__ import annotations

from rlpure.packing._assembly import DatumBatch, assemble_batch, check_datum_batch, datum_arrays
from rlpure.packing._segments import DatumProvenance, ProvenanceSpan, trajectory_segments

__all__ = [
    "DatumBatch",
    "DatumProvenance",
    "ProvenanceSpan",
    "assemble_batch",
    "check_datum_batch",
    "datum_arrays",
    "trajectory_segments",
]
