"""`tinker_cookbook.stores.registry`: `shell.storage.RunRegistry`, adapted.

The adapter hands out this facade's `TrainingRunStore`. Deliberate difference: `get_eval_store`
returns None (the cookbook's `EvalStore` is not ported).
"""

from __future__ import annotations

from shell.cookbook.stores.training_store import TrainingRunStore
from shell.storage import RunInfo, Storage, storage_join
from shell.storage import RunRegistry as _RunRegistry

__all__ = ["RunInfo", "RunRegistry", "Storage", "TrainingRunStore", "storage_join"]


class RunRegistry(_RunRegistry):
    """The runs of several storages (the cookbook's `RunRegistry`)."""

    store_class = TrainingRunStore
