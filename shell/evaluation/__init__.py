"""Evaluation during training: evaluator protocols, the test-set evaluator, results.

- `_evaluators`: `SamplingClientEvaluator`, `TrainingClientEvaluator` and their builder aliases.
- `_benchmarks`: `BenchmarkResult`, the typed outcome of an evaluation.
- `_test_set`: `RLTestSetEvaluator`, rollouts over a test dataset (the loop's test-set
  evaluator; the cookbook has it in `rl.metric_util`).
"""

from shell.evaluation._benchmarks import BenchmarkResult
from shell.evaluation._evaluators import (
    Evaluator,
    EvaluatorBuilder,
    SamplingClientEvaluator,
    SamplingClientEvaluatorBuilder,
    TrainingClientEvaluator,
)
from shell.evaluation._test_set import RLTestSetEvaluator

__all__ = [
    "BenchmarkResult",
    "Evaluator",
    "EvaluatorBuilder",
    "RLTestSetEvaluator",
    "SamplingClientEvaluator",
    "SamplingClientEvaluatorBuilder",
    "TrainingClientEvaluator",
]
