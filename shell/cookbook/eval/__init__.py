"""`tinker_cookbook.eval`: re-exported from `shell.evaluation`."""

from shell.evaluation import (
    BenchmarkResult,
    Evaluator,
    EvaluatorBuilder,
    RLTestSetEvaluator,
    SamplingClientEvaluator,
    SamplingClientEvaluatorBuilder,
    TrainingClientEvaluator,
)

__all__ = [
    "BenchmarkResult",
    "Evaluator",
    "EvaluatorBuilder",
    "RLTestSetEvaluator",
    "SamplingClientEvaluator",
    "SamplingClientEvaluatorBuilder",
    "TrainingClientEvaluator",
]
