"""`tinker_cookbook.preference.preference_datasets`: re-exported from `shell.comparisons._datasets`."""

from shell.comparisons._datasets import (
    ComparisonBuilderFromJsonl,
    ComparisonDatasetBuilder,
)
from shell.comparisons._types import (
    Comparison,
    LabeledComparison,
)

__all__ = [
    "Comparison",
    "ComparisonBuilderFromJsonl",
    "ComparisonDatasetBuilder",
    "LabeledComparison",
]
