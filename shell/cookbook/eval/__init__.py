"""`tinker_cookbook.eval`: the evaluator interfaces and `BenchmarkResult`, from `shell.evaluation`.

Only names the cookbook's `eval` package exports. Not ported (absent here): its benchmark
framework (`BenchmarkBuilder`, `BenchmarkConfig`, `StoredTrajectory`, `REGISTRY`, `register`,
`run_benchmark`, `run_benchmarks`, `print_trajectory`), `BenchmarkEvaluator` and the eval store
(`EvalStore`, `RunMetadata`). The test-set evaluator is `shell.cookbook.rl.metric_util`'s, as in
the cookbook.
"""

from shell.evaluation import (
    BenchmarkResult,
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
    "SamplingClientEvaluator",
    "SamplingClientEvaluatorBuilder",
    "TrainingClientEvaluator",
]
