"""`RLTestSetEvaluator`: rollouts over a whole test dataset, as cookbook 0.6.1's
`rl.metric_util.RLTestSetEvaluator`.

Conventions:
- The dataset's builders are read once, at construction (every batch, in order); each call
  rolls all of them out concurrently (at most `max_concurrent_groups` at a time) with a
  `TinkerTokenCompleter` over the given sampling client, under `strategy`.
- Sampling: `temperature` 1.0 and `max_tokens`, as the cookbook's evaluator (which passes no
  temperature, so its completer's default 1.0); `temperature=0.0` samples greedily. A `seed`
  makes call `n` of the completer sample with `seed + n` (`shell.completion`).
- Metrics: `<name>/<key>` for every `rlpure.metrics.trajectory_metrics` key of the groups that
  succeeded (e.g. `test/env/all/reward/total`) and every rollout-error count
  (`shell.rollouts.batch_rollout_error_metrics`), plus `<name>/num_groups` (successful groups,
  an rlpure addition). `last_result` holds the call's `BenchmarkResult`: one example per group
  (one problem), correct when any trajectory's total reward is > 0, failed groups counted as
  errors, scored as the cookbook's.
- Each call ends in `_collect_eval_metrics(results, rollout_summary_export, store=store)`, the
  cookbook's hook (one `TrajectoryGroup | None` per builder), so a subclass that overrides it,
  as cookbook recipes do, sees every call's results.
"""

from __future__ import annotations

from collections.abc import Sequence

from returns.result import Success

from rlpure import metrics as metrics_lib
from rlpure.records import TrajectoryGroup
from shell.clients import SamplingClient
from shell.completion import TinkerTokenCompleter, TokenCompleter
from shell.env import EnvGroupBuilder, RLDataset
from shell.evaluation._benchmarks import BenchmarkResult
from shell.evaluation._evaluators import SamplingClientEvaluator
from shell.rollouts import RolloutErrorCounter, RolloutStrategy, do_batch_rollouts

__all__ = ["RLTestSetEvaluator"]


class RLTestSetEvaluator(SamplingClientEvaluator):
    """Evaluates a sampling client by rolling out every group of a test dataset.

    Args:
        dataset: the test dataset (all its batches are evaluated).
        max_tokens: cap on sampled tokens per action.
        name: metric prefix (`"test"` → `test/env/all/reward/total`) and `BenchmarkResult.name`.
        num_groups_to_log: the cookbook's logtree option; accepted for compatibility, unused
            (the loop logs training samples to `samples.jsonl` only).
        strategy: failure handling per group (`FailFast()` when None).
        temperature: sampling temperature (1.0 as the cookbook; 0.0 is greedy).
        max_concurrent_groups: at most this many groups in flight (None: all).
        seed: base sampling seed of every call (None: the sampler's own randomness); a call's
            `seed=` overrides it.

    Attributes:
        last_result: the `BenchmarkResult` of the latest call (None before the first).
        last_groups: the latest call's successful groups with their logging tags, in dataset
            order (the loop's `eval_test.html` report reads them; empty before the first call).

    Examples:
        >>> from shell.fakes import FakeSamplingClient, ScriptedDataset, ScriptedEnv
        >>> from shell.fakes import ScriptedGroupBuilder
        >>> data = ScriptedDataset(
        ...     lambda b, p: ScriptedGroupBuilder(lambda i: ScriptedEnv(rewards=[1.0]),
        ...                                       group_size=2),
        ...     num_batches=1, groups_per_batch=3)
        >>> evaluator = RLTestSetEvaluator(data, max_tokens=4)
        >>> import asyncio
        >>> metrics = asyncio.run(evaluator(FakeSamplingClient()))
        >>> metrics["test/env/all/reward/total"], metrics["test/num_groups"]
        (1.0, 3.0)
        >>> evaluator.last_result.score, evaluator.last_result.num_examples
        (1.0, 3)
    """

    def __init__(
        self,
        dataset: RLDataset,
        max_tokens: int,
        name: str = "test",
        num_groups_to_log: int = 4,
        strategy: RolloutStrategy | None = None,
        *,
        temperature: float = 1.0,
        max_concurrent_groups: int | None = None,
        seed: int | None = None,
    ) -> None:
        self.env_group_builders_P: list[EnvGroupBuilder] = [
            builder for i in range(len(dataset)) for builder in dataset.get_batch(i)
        ]
        self.max_tokens = max_tokens
        self.name = name
        self.num_groups_to_log = num_groups_to_log
        self.strategy = strategy
        self.temperature = temperature
        self.max_concurrent_groups = max_concurrent_groups
        self.seed = seed
        self.last_result: BenchmarkResult | None = None
        self.last_groups: tuple[tuple[TrajectoryGroup, list[str]], ...] = ()

    async def __call__(
        self,
        sampling_client: SamplingClient,
        *,
        seed: int | None = None,
        rollout_summary_export: object | None = None,
        store: object | None = None,
    ) -> dict[str, float]:
        """Rolls out every test group with `sampling_client`; returns the prefixed metrics.

        Args:
            sampling_client: a sampling client of the weights to evaluate.
            seed: base sampling seed of this call (default: the evaluator's `seed`).
            rollout_summary_export: the cookbook's rollout-summary export, passed on to
                `_collect_eval_metrics` (written by the cookbook facade's subclass).
            store: the cookbook's training-run store, passed on likewise.

        Raises:
            Exception: under `FailFast`, the first rollout failure.
        """
        policy = TinkerTokenCompleter(
            sampling_client,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            seed=self.seed if seed is None else seed,
        )
        return await self.eval_token_completer(
            policy, rollout_summary_export=rollout_summary_export, store=store
        )

    async def eval_token_completer(
        self,
        policy: TokenCompleter,
        *,
        rollout_summary_export: object | None = None,
        store: object | None = None,
    ) -> dict[str, float]:
        """Rolls out every test group with `policy` (any `TokenCompleter`, the cookbook's
        method of this name); returns the prefixed metrics, as `__call__`.

        Raises:
            Exception: under `FailFast`, the first rollout failure.
        """
        outcomes = await do_batch_rollouts(
            self.env_group_builders_P,
            policy,
            strategy=self.strategy,
            max_concurrent_groups=self.max_concurrent_groups,
        )
        results: list[TrajectoryGroup | None] = [
            outcome.unwrap() if isinstance(outcome, Success) else None for outcome in outcomes
        ]
        return self._collect_eval_metrics(results, rollout_summary_export, store=store)

    def _collect_eval_metrics(
        self,
        results: list[TrajectoryGroup | None],
        rollout_summary_export: object | None,
        *,
        store: object | None = None,
    ) -> dict[str, float]:
        """The metrics of one evaluation's results, as the cookbook's hook of the same name.

        Sets `last_result` and `last_groups`; a subclass may extend the metrics (the cookbook's
        recipes override this to add set-level metrics such as AUC).

        Args:
            results: one entry per builder of `env_group_builders_P`, None for a failed group.
            rollout_summary_export: unused here (the cookbook facade's subclass writes it).
            store: unused here, likewise.

        Returns:
            The metrics, each key prefixed `<name>/`.
        """
        del rollout_summary_export, store
        kept = [
            (builder, group)
            for builder, group in zip(self.env_group_builders_P, results, strict=True)
            if group is not None
        ]
        groups = [group for _, group in kept]
        counter = RolloutErrorCounter()
        for result in results:
            counter.ingest(result)
        found: dict[str, float] = {"num_groups": float(len(groups))}
        found.update(counter.get_metrics())
        if groups:
            tags = [builder.logging_tags() for builder, _ in kept]
            found.update(
                {k: float(v) for k, v in metrics_lib.trajectory_metrics(groups, tags).items()}
            )
        self.last_result = _benchmark_result(self.name, groups, len(results), found)
        self.last_groups = tuple((group, builder.logging_tags()) for builder, group in kept)
        return {f"{self.name}/{key}": value for key, value in found.items()}


def _benchmark_result(
    name: str, groups: Sequence[TrajectoryGroup], num_groups: int, metrics: dict[str, float]
) -> BenchmarkResult:
    correct = sum(1 for group in groups if any(r > 0 for r in group.get_total_rewards()))
    return BenchmarkResult(
        name=name,
        score=correct / num_groups if num_groups else 0.0,
        num_examples=num_groups,
        num_correct=correct,
        num_errors=num_groups - len(groups),
        metrics=dict(metrics),
    )
