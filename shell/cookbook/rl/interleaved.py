"""The cookbook's `tinker_cookbook.rl.interleaved`: one training dataset blended from several.

A thin facade over `shell.datasets.InterleavedRLDatasetBuilder`, whose docstring states how
the sources are weighted and ordered.
"""

from __future__ import annotations

from shell.datasets import InterleavedRLDatasetBuilder

__all__ = ["InterleavedRLDatasetBuilder"]
