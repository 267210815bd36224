"""`tinker_cookbook.eval.evaluators`: re-exported from `shell.evaluation._evaluators`."""

from shell.clients import (
    SamplingClient,
    TrainingClient,
)
from shell.evaluation._evaluators import (
    Evaluator,
    EvaluatorBuilder,
    SamplingClientEvaluator,
    SamplingClientEvaluatorBuilder,
    TrainingClientEvaluator,
)

__all__ = [
    "Evaluator",
    "EvaluatorBuilder",
    "SamplingClient",
    "SamplingClientEvaluator",
    "SamplingClientEvaluatorBuilder",
    "TrainingClient",
    "TrainingClientEvaluator",
]
