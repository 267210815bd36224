"""tinker-cookbook 0.6.1's `preference.preference_datasets`: where comparisons come from.

`ComparisonDatasetBuilder` (a chz config) loads raw rows (`get_train_and_test_datasets`, a
Hugging Face `datasets.Dataset` or anything with `len`, `[i]` and `select(range)`) and turns each
row into a `LabeledComparison` (`example_to_labeled_comparison`, `None` skips the row); RL
datasets such as `rl/preference_envs.py`'s read prompts from it batch by batch.
`ComparisonBuilderFromJsonl` reads rows written as `{"comparison": {...}, "label": ...}`.

Not offered here: `ChatDatasetBuilderFromComparisons`, which builds supervised (SL/DPO)
datasets — this project trains RL only. `ComparisonBuilderFromJsonl` reads local paths (the
cookbook's also reads blob-store URLs through `blobfile`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import chz

from shell.comparisons._types import Comparison, LabeledComparison

if TYPE_CHECKING:
    import datasets

__all__ = ["ComparisonBuilderFromJsonl", "ComparisonDatasetBuilder"]


@chz.chz
class ComparisonDatasetBuilder:
    """Raw comparison rows and how to read them; subclasses implement the two loaders.

    Attributes:
        swap: augment by also using each comparison with A and B exchanged (read by the
            datasets built from this builder).
    """

    swap: bool = False

    def get_train_and_test_datasets(self) -> tuple[datasets.Dataset, datasets.Dataset | None]:
        """The raw train rows and, optionally, test rows."""
        raise NotImplementedError

    def example_to_labeled_comparison(self, example: dict[str, Any]) -> LabeledComparison | None:
        """The comparison in one raw row, or `None` to skip the row."""
        raise NotImplementedError

    def get_labeled_comparisons(
        self,
    ) -> tuple[list[LabeledComparison], list[LabeledComparison] | None]:
        """Every row's comparison (skipped rows left out), train and (when present) test."""
        train_rows, test_rows = self.get_train_and_test_datasets()
        train = self._comparisons(train_rows)
        return train, None if test_rows is None else self._comparisons(test_rows)

    def _comparisons(self, rows: datasets.Dataset) -> list[LabeledComparison]:
        found = (self.example_to_labeled_comparison(rows[i]) for i in range(len(rows)))
        return [comparison for comparison in found if comparison is not None]


def _read_jsonl_rows(path: str) -> datasets.Dataset:
    import datasets

    with Path(path).open(encoding="utf-8") as lines:
        rows = [json.loads(line) for line in lines if line.strip()]
    return datasets.Dataset.from_list(rows)


@chz.chz
class ComparisonBuilderFromJsonl(ComparisonDatasetBuilder):
    """Comparisons from JSONL files of `{"comparison": {prompt_conversation, completion_A,
    completion_B}, "label": "A" | "B" | "Tie"}` lines.

    Attributes:
        train_path: the training rows' file.
        test_path: the test rows' file, if any.
    """

    train_path: str
    test_path: str | None = None

    def get_train_and_test_datasets(self) -> tuple[datasets.Dataset, datasets.Dataset | None]:
        """The files' rows as `datasets.Dataset`s (blank lines skipped)."""
        train = _read_jsonl_rows(self.train_path)
        return train, _read_jsonl_rows(self.test_path) if self.test_path else None

    def example_to_labeled_comparison(self, example: dict[str, Any]) -> LabeledComparison | None:
        """The row's comparison; `None` (skip) when it lacks `comparison` or `label`.

        `datasets.Dataset.from_list` fills a key that only some lines have with `None` in the
        others; such a row is skipped too. (The cookbook checks only for absent keys, so a file
        mixing such lines raises `TypeError` there: a bug against its own contract.)
        """
        if example.get("comparison") is None or example.get("label") is None:
            return None
        fields = example["comparison"]
        comparison = Comparison(
            prompt_conversation=fields["prompt_conversation"],
            completion_A=fields["completion_A"],
            completion_B=fields["completion_B"],
        )
        return LabeledComparison(comparison=comparison, label=example["label"])
