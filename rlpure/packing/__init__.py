"""Trajectories → datums → one padded batch: the cookbook's `trajectory_to_data` and
`assemble_training_data`, vectorised.

- `_segments`: how a trajectory's turns become datum segments (prefix merging, masks,
  provenance spans): `trajectory_segments`, `ProvenanceSpan`, `DatumProvenance`.
- `_assembly`: segments of a whole batch → `DatumBatch`, bucketed padded `[D, T]` arrays
  (`assemble_batch`), the boundary check `check_datum_batch` and `datum_arrays`.
- `_prefix_tree`: datums sharing token prefixes packed as tries in pre-order, so a model
  computes each shared prefix once (`pack_prefix_tree`, `group_prefix_rows`).
- `_prefix_groups`: datums grouped by a shared prefix, one prefix row per group and one suffix
  row per datum (`sort_sequences`, `group_shared_prefixes`, `PrefixGroup`), planned into
  chunks by `plan_grouped_chunks`.

Each part's docstring states its conventions (alignment, masks, padding).
"""

from __future__ import annotations

from rlpure.packing._assembly import DatumBatch, assemble_batch, check_datum_batch, datum_arrays
from rlpure.packing._prefix_groups import (
    GroupedChunk,
    GroupedPlan,
    PrefixGroup,
    SortedSequences,
    group_shared_prefixes,
    plan_grouped_chunks,
    sort_sequences,
)
from rlpure.packing._prefix_tree import (
    PrefixTree,
    common_prefix_length,
    group_prefix_rows,
    pack_prefix_tree,
    prefix_tree_size,
)
from rlpure.packing._segments import DatumProvenance, ProvenanceSpan, trajectory_segments

__all__ = [
    "DatumBatch",
    "DatumProvenance",
    "GroupedChunk",
    "GroupedPlan",
    "PrefixGroup",
    "PrefixTree",
    "ProvenanceSpan",
    "SortedSequences",
    "assemble_batch",
    "check_datum_batch",
    "common_prefix_length",
    "datum_arrays",
    "group_prefix_rows",
    "group_shared_prefixes",
    "pack_prefix_tree",
    "plan_grouped_chunks",
    "prefix_tree_size",
    "sort_sequences",
    "trajectory_segments",
]
