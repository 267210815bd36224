"""What a training loop carries from step to step, and the step parts every mode shares.

`_Run` is the per-run state `shell.training._loop.train` builds once and its step functions
update (the sync step in `_loop`, the streaming and async modes in `_stream` / `_async`):
clients, the loop's PRNG key, the strategy, evaluators, token totals. The helpers here are the
parts those modes share: keeping the successful groups of a batch, counting a step's tokens,
running the evaluators (with their timing spans, `shell.timing`), writing a
checkpoint record.

Token counts (`_count_tokens`, the cookbook's sync loop and `CostTracker`): a step counts the
rollouts and datums of the groups it trained on, plus the prefill of the scoring passes it
made over those datums (the KL reference's logprobs with `kl_penalty_coef > 0`, the updated
policy's with `compute_post_kl`): each pass prefills every datum's full sequence (its
`model_input` plus the last target, `trained + num_datums` tokens). The cookbook scores with
one-token `sample` requests and so also counts one sampled token per datum and the cache hits
the responses report; our passes are `compute_logprobs` calls, which sample nothing and report
no cache hits, so the pass counts all its prompt tokens as `prefill_uncached` and no sampled
tokens. Groups dropped before training (constant reward) count only in the running and
discarded totals.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import jax
import tinker
from returns.result import Success

from rlpure import usage as usage_lib
from rlpure.cost import TokenCostRates, cost_metrics
from rlpure.records import TrajectoryGroup
from rlpure.render import TokenizerLike
from shell.clients import SamplingClient, TrainingClient
from shell.config import TrainConfig
from shell.env import EnvGroupBuilder
from shell.evaluation import RLTestSetEvaluator, SamplingClientEvaluator
from shell.limits import TerminationRewardPolicy
from shell.rollouts import GroupOutcome, RolloutErrorCounter, RolloutStrategy
from shell.timing import span
from shell.training._checkpoints import Checkpointer, CheckpointRecord
from shell.training._reports import write_rollout_report
from shell.training._resume import prng_key_data

__all__: list[str] = []  # private to shell.training; the modes import the names they share


@dataclass
class _Run:
    """What the loop carries from step to step (shell-side, mutable by design)."""

    config: TrainConfig
    log_dir: Path
    num_steps: int
    training_client: TrainingClient
    sampling_client: SamplingClient
    kl_reference_client: SamplingClient | None
    kl_reference_path: str | None
    key: jax.Array
    strategy: RolloutStrategy
    adam_params: tinker.AdamParams
    evaluators: list[SamplingClientEvaluator]
    test_evaluator: RLTestSetEvaluator | None
    error_counter: RolloutErrorCounter | None
    termination: TerminationRewardPolicy | None
    decode: Callable[[Sequence[int]], str]
    tokens: usage_lib.TokenUsage  # running totals (rlpure.usage), discarded sampling included
    discarded_tokens: usage_lib.TokenUsage
    checkpointer: Checkpointer  # periodic, rolling and final saves (shell.training._checkpoints)
    rates: TokenCostRates | None = None  # the model's prices (`TrainConfig.price_table`)


def _successful(
    builders_P: Sequence[EnvGroupBuilder], outcomes_P: Sequence[GroupOutcome]
) -> tuple[list[EnvGroupBuilder], list[TrajectoryGroup]]:
    kept_builders, kept_groups = [], []
    for builder, outcome in zip(builders_P, outcomes_P, strict=True):
        if isinstance(outcome, Success):
            kept_builders.append(builder)
            kept_groups.append(outcome.unwrap())
    return kept_builders, kept_groups


def _scoring_passes(run: _Run) -> int:
    """How many logprob passes a trained step makes over its datums (see the module
    docstring): the KL reference's and the post-update policy's."""
    kl = run.kl_reference_client is not None and run.config.kl_penalty_coef > 0
    return int(kl) + int(run.config.compute_post_kl)


def _count_tokens(
    run: _Run,
    groups: Sequence[TrajectoryGroup],
    trained: Sequence[TrajectoryGroup],
    *,
    num_datums: int = 0,
) -> dict[str, float]:
    """The step's `tokens/*` and `tokens/cumulative/*` metrics, and with `run.rates` its
    `cost/step_usd` and `cost/cumulative_usd` (`rlpure.cost`; see the module docstring;
    `num_datums` is the number of datums built from `trained`, for the scoring passes)."""
    trained_ids = {id(group) for group in trained}
    discarded = usage_lib.rollout_usage(g for g in groups if id(g) not in trained_ids)
    training = usage_lib.training_usage(trained)
    scoring = usage_lib.TokenUsage(
        prefill_uncached=_scoring_passes(run) * (training.trained + num_datums)
    )
    step = usage_lib.rollout_usage(trained) + training + scoring
    run.discarded_tokens += discarded
    run.tokens += discarded + step
    metrics: dict[str, float] = {
        **step.metrics("tokens"),
        **run.tokens.metrics("tokens/cumulative"),
    }
    if run.rates is not None:
        metrics.update(cost_metrics(step, run.tokens, run.rates))
    return metrics


_EVAL_STREAM = 0x6576616C
"""Folded into the run's seed to derive evaluation seeds (so evaluating draws nothing from the
loop's key: the training seeds of a run are the same with or without evaluation)."""


def _eval_seed(seed: int, step: int) -> int:
    """The sampling seed of the evaluation at `step` (deterministic, as the training seeds)."""
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), _EVAL_STREAM), step)
    return int(jax.random.randint(key, (), 0, 2**31 - 1))


async def _timed_evaluation(call: Awaitable[Mapping[str, float]]) -> Mapping[str, float]:
    with span("run_single_evaluation"):
        return await call


async def _run_evaluators(run: _Run, step: int) -> dict[str, float]:
    """Every evaluator on the current sampler, concurrently; metrics merged in order (a later
    evaluator's key wins; the test-set evaluator is last), as the cookbook's
    `run_evaluations_parallel`. Spans: `run_evals` and `run_evaluations_parallel` around the
    whole, `run_single_evaluation` per evaluator (the cookbook's)."""
    calls: list[Awaitable[Mapping[str, float]]] = [
        evaluator(run.sampling_client) for evaluator in run.evaluators
    ]
    if run.test_evaluator is not None:
        calls.append(
            run.test_evaluator(run.sampling_client, seed=_eval_seed(run.config.seed, step))
        )
    merged: dict[str, float] = {}
    with span("run_evals"), span("run_evaluations_parallel"):
        for found in await asyncio.gather(*(_timed_evaluation(call) for call in calls)):
            merged.update(found)
    evaluated = getattr(run.test_evaluator, "last_groups", ())  # see shell.training._reports
    if run.test_evaluator is not None and evaluated:
        write_rollout_report(
            run.log_dir,
            step=step,
            groups_P=[group for group, _ in evaluated],
            tags_P=[tags for _, tags in evaluated],
            decode=run.decode,
            num_groups_to_log=run.config.num_groups_to_log,
            base_name=f"eval_{run.test_evaluator.name}",
            split=f"eval/{run.test_evaluator.name}",
            title=f"Running evaluation {run.test_evaluator.name} {step}",
        )
    return merged


def _evaluates(run: _Run) -> bool:
    return bool(run.config.eval_every) and (bool(run.evaluators) or run.test_evaluator is not None)


async def _checkpoint(run: _Run, step: int, *, final: bool = False) -> CheckpointRecord | None:
    """The save due after `step` completed steps (`final`: the run's last, always saved), as
    `Checkpointer.save` decides; None when none is due. A save is timed as the span
    `save_checkpoint_async` (the cookbook's name)."""
    if not final and run.checkpointer.due(step) is None:
        return None
    with span("save_checkpoint_async"):
        return await run.checkpointer.save(
            step,
            final=final,
            rng_key_data=prng_key_data(run.key),
            kl_reference_path=run.kl_reference_path,
            cumulative_tokens=run.tokens,
            discarded_tokens=run.discarded_tokens,
        )


def _decoder(tokenizer: TokenizerLike | None) -> Callable[[Sequence[int]], str]:
    if tokenizer is None:
        return lambda ids: " ".join(str(i) for i in ids)
    return lambda ids: str(tokenizer.decode(list(ids)))
