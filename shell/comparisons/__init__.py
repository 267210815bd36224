"""Pairwise comparisons: preference models (judges), comparison datasets, preference RL.

- `_types`: `Comparison`, `LabeledComparison`, `PreferenceModel`, `PreferenceModelBuilder`,
  `PreferenceModelFromChatRenderer` (a judge sampled for one token), its builder, and the
  comparison renderers; torch-free.
- `_datasets`: `ComparisonDatasetBuilder`, `ComparisonBuilderFromJsonl`.
- `_tournament`: pairwise-preference RL, where a group's completions play a tournament scored
  by a preference model (`PairwisePreferenceRLDatasetBuilder` and its parts).
"""

from shell.comparisons._datasets import ComparisonBuilderFromJsonl, ComparisonDatasetBuilder
from shell.comparisons._tournament import (
    PairwisePreferenceDataset,
    PairwisePreferenceGroupBuilder,
    PairwisePreferenceRLDatasetBuilder,
    PreferenceEnv,
    TournamentPattern,
    get_pairs,
    get_pairs_chunked,
    tournament_scores,
)
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
    "PairwisePreferenceDataset",
    "PairwisePreferenceGroupBuilder",
    "PairwisePreferenceRLDatasetBuilder",
    "PreferenceEnv",
    "PreferenceModel",
    "PreferenceModelBuilder",
    "PreferenceModelBuilderFromChatRenderer",
    "PreferenceModelFromChatRenderer",
    "TournamentPattern",
    "get_pairs",
    "get_pairs_chunked",
    "tournament_scores",
]
