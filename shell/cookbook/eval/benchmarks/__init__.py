"""Benchmark evaluation records (the cookbook's `tinker_cookbook.eval.benchmarks`; only the
result types the RL loop produces are here, no benchmark registry).

- `_types`: `BenchmarkResult` and its `Metrics` / `Logs` / `PassAtKScores` aliases.
"""

from shell.evaluation._benchmarks import BenchmarkResult, Logs, Metrics, PassAtKScores

__all__ = ["BenchmarkResult", "Logs", "Metrics", "PassAtKScores"]
