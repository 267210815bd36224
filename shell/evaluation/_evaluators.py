"""Evaluator interfaces for inline evaluation during training (the cookbook's
`tinker_cookbook.eval.evaluators`, same names, so cookbook evaluators port by the import-prefix
rewrite).

Conventions:
- An evaluator is an object whose `async __call__` takes one client and returns flat
  `dict[str, float]` metrics. `shell.training.train(evaluator_builders=...)` takes
  `SamplingClientEvaluatorBuilder`s (zero-argument callables), builds each evaluator once at the
  start of the run and calls it with the current sampling client every `eval_every` steps and
  after the last; the metrics of all evaluators are merged into the step's (a later
  evaluator's key wins, the test-set evaluator comes last), as the cookbook's
  `run_evaluations_parallel` does.
- The loop only calls `await evaluator(sampling_client)`: any object of that shape works,
  including a `tinker_cookbook` evaluator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

from shell.clients import SamplingClient, TrainingClient

__all__ = [
    "Evaluator",
    "EvaluatorBuilder",
    "SamplingClientEvaluator",
    "SamplingClientEvaluatorBuilder",
    "TrainingClientEvaluator",
]


class TrainingClientEvaluator:
    """An evaluator computing metrics with a training client (e.g. a held-out loss).

    Subclasses implement `__call__`. The RL loop (`shell.training.train`) runs sampling-client
    evaluators only, as the cookbook's RL loop does; this base is for supervised loops and for
    cookbook code that imports it.
    """

    async def __call__(self, training_client: TrainingClient) -> dict[str, float]:
        """Runs the evaluation.

        Args:
            training_client: the run's training client.

        Returns:
            Metric names to values.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement __call__")


class SamplingClientEvaluator:
    """An evaluator computing metrics with a sampling client (e.g. accuracy on a test set).

    Subclasses implement `__call__`; `shell.training.train` calls it with a sampling client of
    the current weights.

    Examples:
        >>> class Constant(SamplingClientEvaluator):
        ...     async def __call__(self, sampling_client):
        ...         return {"eval/constant": 1.0}
        >>> import asyncio
        >>> asyncio.run(Constant()(None))
        {'eval/constant': 1.0}
    """

    async def __call__(self, sampling_client: SamplingClient) -> dict[str, float]:
        """Runs the evaluation.

        Args:
            sampling_client: a sampling client of the weights to evaluate.

        Returns:
            Metric names to values.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement __call__")


EvaluatorBuilder: TypeAlias = Callable[[], TrainingClientEvaluator | SamplingClientEvaluator]
"""Makes an evaluator of either kind (called once, at the start of a run)."""
SamplingClientEvaluatorBuilder: TypeAlias = Callable[[], SamplingClientEvaluator]
"""Makes a sampling-client evaluator (what `train(evaluator_builders=...)` takes)."""
Evaluator: TypeAlias = TrainingClientEvaluator | SamplingClientEvaluator
"""Either kind of evaluator."""
