"""The cookbook's `tinker_cookbook.rl.dataset_utils`: epochs over an `RLDataset`.

A thin facade over `shell.datasets` (`EpochCycledRLDataset`, `cycle_permutation`,
`epoch_batch_index`), whose docstring states the orders.
"""

from __future__ import annotations

from shell.datasets import EpochCycledRLDataset, cycle_permutation, epoch_batch_index

__all__ = ["EpochCycledRLDataset", "cycle_permutation", "epoch_batch_index"]
