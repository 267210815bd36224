"""`tinker_cookbook.stores._incremental`: re-exported from `shell.storage`."""

from shell.storage import IncrementalReader

__all__ = ["IncrementalReader"]
