"""Evaluation during training: the cookbook's `tinker_cookbook.eval` names the RL loop uses.

- `evaluators`: `SamplingClientEvaluator`, `TrainingClientEvaluator` and their builder aliases
  (the module keeps the cookbook's name, so `from shell.eval.evaluators import ...` is the
  import-prefix rewrite of a cookbook import).
- `benchmarks`: `BenchmarkResult`, the typed outcome of an evaluation.
- `_test_set`: `RLTestSetEvaluator`, rollouts over a test dataset (the loop's test-set
  evaluator; the cookbook has it in `rl.metric_util`).
"""

from shell.eval._test_set import RLTestSetEvaluator
from shell.eval.benchmarks import BenchmarkResult
from shell.eval.evaluators import (
    Evaluator,
    EvaluatorBuilder,
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
