"""Result records of the benchmark evaluation framework (the cookbook's
`tinker_cookbook.eval.benchmarks._types`, the part the RL loop uses).

`BenchmarkResult` is a plain dataclass, not a frozen msgspec record like the project's others:
cookbook code builds it positionally and with `BenchmarkResult(**d)`, and reads it with
`dataclasses.asdict`, so it keeps the cookbook's form for code that ports by the import rewrite.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeAlias

__all__ = ["BenchmarkResult", "Logs", "Metrics", "PassAtKScores"]

Metrics: TypeAlias = dict[str, float | int]
"""Numeric values aggregated across examples (e.g. `{"correct": 1.0}`)."""
Logs: TypeAlias = dict[str, Any]
"""Per-example diagnostic data, not aggregated."""
PassAtKScores: TypeAlias = dict[int, float]
"""k → unbiased pass@k estimate in [0, 1]."""


@dataclass
class BenchmarkResult:
    """Aggregated result of one evaluation run (e.g. `RLTestSetEvaluator.last_result`).

    Every example is exactly one of: correct, wrong, truncated or errored, so
    `num_examples = num_correct + num_wrong + num_truncated + num_errors`.

    Attributes:
        name: benchmark or evaluator name (e.g. "test").
        score: raw accuracy `num_correct / num_examples` (truncated and errored count as 0).
        num_examples: examples evaluated (for an RL test set: groups, one per problem).
        num_correct: examples graded correct (reward > 0).
        num_errors: examples that failed (timeout, crash), scored 0.
        num_truncated: examples stopped by a length limit before grading, scored 0.
        metrics: further aggregated metrics (for an RL test set: its unprefixed metrics).
        time_seconds: wall time of the run.
        pass_at_k: pass@k scores (only with several samples per example).

    Examples:
        >>> r = BenchmarkResult(name="test", score=0.5, num_examples=4, num_correct=2,
        ...                     num_errors=1)
        >>> r.num_completed, round(r.score_completed, 3)
        (3, 0.667)
    """

    name: str
    score: float
    num_examples: int
    num_correct: int
    num_errors: int = 0
    num_truncated: int = 0
    metrics: Metrics = field(default_factory=dict)
    time_seconds: float = 0.0
    pass_at_k: PassAtKScores = field(default_factory=dict)

    @property
    def num_completed(self) -> int:
        """Examples that completed without error or truncation."""
        return self.num_examples - self.num_errors - self.num_truncated

    @property
    def score_completed(self) -> float:
        """Accuracy on completed examples only (0.0 when none completed)."""
        return self.num_correct / self.num_completed if self.num_completed > 0 else 0.0
