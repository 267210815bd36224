"""The cookbook's `tinker_cookbook.rl.preference_envs`: pairwise-preference RL envs.

A thin facade over `shell.comparisons._tournament` (its module docstring states the reward: a
tournament of each group's completions scored by a preference model, plus a format term).
"""

from __future__ import annotations

from shell.comparisons._tournament import (
    PairwisePreferenceDataset,
    PairwisePreferenceGroupBuilder,
    PairwisePreferenceRLDatasetBuilder,
    PreferenceEnv,
    TournamentPattern,
    get_pairs,
    get_pairs_chunked,
)

__all__ = [
    "PairwisePreferenceDataset",
    "PairwisePreferenceGroupBuilder",
    "PairwisePreferenceRLDatasetBuilder",
    "PreferenceEnv",
    "TournamentPattern",
    "get_pairs",
    "get_pairs_chunked",
]
