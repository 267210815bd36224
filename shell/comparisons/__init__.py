"""Pairwise comparisons: preference models (judges) and comparison datasets.

- `_types`: `Comparison`, `LabeledComparison`, `PreferenceModel`, `PreferenceModelBuilder`,
  `PreferenceModelFromChatRenderer` (a judge sampled for one token), its builder, and the
  comparison renderers; torch-free.
- `_datasets`: `ComparisonDatasetBuilder`, `ComparisonBuilderFromJsonl`.
"""

from shell.comparisons._datasets import ComparisonBuilderFromJsonl, ComparisonDatasetBuilder
from shell.comparisons._types import (
    ChatRenderer,
    Comparison,
    ComparisonRenderer,
    ComparisonRendererFromChatRenderer,
    LabeledComparison,
    PreferenceModel,
    PreferenceModelBuilder,
    PreferenceModelBuilderFromChatRenderer,
    PreferenceModelFromChatRenderer,
)

__all__ = [
    "ChatRenderer",
    "Comparison",
    "ComparisonBuilderFromJsonl",
    "ComparisonDatasetBuilder",
    "ComparisonRenderer",
    "ComparisonRendererFromChatRenderer",
    "LabeledComparison",
    "PreferenceModel",
    "PreferenceModelBuilder",
    "PreferenceModelBuilderFromChatRenderer",
    "PreferenceModelFromChatRenderer",
]
