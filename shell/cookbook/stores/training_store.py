"""`tinker_cookbook.stores.training_store`: `shell.storage.TrainingRunStore`, adapted.

The adapter adds `read_checkpoint_records`, which parses rows with this facade's
`checkpoint_utils.CheckpointRecord` (the cookbook's record type).
"""

from __future__ import annotations

from typing import Any

from shell.cookbook.checkpoint_utils import CheckpointRecord
from shell.storage import IncrementalReader, IterationInfo, Storage, storage_join
from shell.storage import TrainingRunStore as _TrainingRunStore

__all__ = ["IncrementalReader", "IterationInfo", "Storage", "TrainingRunStore", "storage_join"]


class TrainingRunStore(_TrainingRunStore):
    """Typed reads and writes of one run's files (the cookbook's `TrainingRunStore`)."""

    def read_checkpoint_records(self) -> list[Any]:
        """The rows of `checkpoints.jsonl` as `CheckpointRecord`s (rows it rejects skipped)."""
        return self.read_jsonl_typed(CheckpointRecord.from_dict, "checkpoints.jsonl")
