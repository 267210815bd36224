"""A run's context (what stays fixed for a whole `train` call) and its state (what steps change).

`RunContext` is built once by `shell.training._loop.train` and read by every mode's step
(`_sync`, `_stream`, `_async`): the config, the clients, the strategy, evaluators, the
checkpointer. `RunState` is what a step changes — the loop's PRNG key, the current sampler, the
running token totals — passed to a step and returned by it as a new value. Two objects in the
context keep their own running state, each owned by its module: the rollout-error counter
(`shell.rollouts.RolloutErrorCounter`, one per call as the cookbook's) and the checkpointer
(`shell.training._saves.Checkpointer`, which remembers the rolling state to delete).

Token counts (`count_tokens`, the cookbook's sync loop and `CostTracker`): a step counts the
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

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import jax
import msgspec
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
from shell.rollouts import (
    GroupOutcome,
    RolloutErrorCounter,
    RolloutStrategy,
    TerminationRewardPolicy,
)
from shell.training._saves import Checkpointer

__all__ = [
    "RunContext",
    "RunState",
    "TokenTotals",
    "count_tokens",
    "decoder",
    "successful",
]


class RunContext(msgspec.Struct, frozen=True, kw_only=True):
    """What a `train` call fixes before its first step (see the module docstring).

    Attributes:
        config: every option of the run.
        log_dir: the run's log directory.
        num_steps: the run's last step + 1 (`resolve_num_steps`).
        training_client: the run's training client.
        kl_reference_client: the KL reference's sampler (None: no KL penalty).
        kl_reference_path: its weights when the loop saved them (carried in checkpoints).
        strategy: failure handling of rollouts.
        adam_params: the optimizer's parameters.
        evaluators: the run's evaluators, built once.
        test_evaluator: the test set's evaluator, run after them (None: no test set).
        error_counter: running rollout-error counts for the call (None: the strategy raises).
        termination: the reward policy applied after grading (None: none).
        decode: token ids to text, for samples and rollout pages.
        checkpointer: periodic, rolling and final saves (`shell.training._saves`).
        rates: the model's prices (`TrainConfig.price_table`), or None.
    """

    config: TrainConfig
    log_dir: Path
    num_steps: int
    training_client: TrainingClient
    kl_reference_client: SamplingClient | None
    kl_reference_path: str | None
    strategy: RolloutStrategy
    adam_params: tinker.AdamParams
    evaluators: tuple[SamplingClientEvaluator, ...]
    test_evaluator: RLTestSetEvaluator | None
    error_counter: RolloutErrorCounter | None
    termination: TerminationRewardPolicy | None
    decode: Callable[[Sequence[int]], str]
    checkpointer: Checkpointer
    rates: TokenCostRates | None = None


class TokenTotals(NamedTuple):
    """The run's running token totals (`rlpure.usage`).

    Attributes:
        tokens: every token counted so far, discarded sampling included.
        discarded: the part sampled for groups dropped before training.
    """

    tokens: usage_lib.TokenUsage
    discarded: usage_lib.TokenUsage


class RunState(NamedTuple):
    """What the steps of a run change, as a value (a step returns the next one).

    Attributes:
        key: the loop's jax PRNG key (split once per step).
        sampling_client: the sampler of the current weights.
        totals: the running token totals.
    """

    key: jax.Array
    sampling_client: SamplingClient
    totals: TokenTotals


def successful(
    builders_P: Sequence[EnvGroupBuilder], outcomes_P: Sequence[GroupOutcome]
) -> tuple[list[EnvGroupBuilder], list[TrajectoryGroup]]:
    """The builders and groups of the outcomes that succeeded, in order."""
    kept_builders, kept_groups = [], []
    for builder, outcome in zip(builders_P, outcomes_P, strict=True):
        if isinstance(outcome, Success):
            kept_builders.append(builder)
            kept_groups.append(outcome.unwrap())
    return kept_builders, kept_groups


def _scoring_passes(ctx: RunContext) -> int:
    """How many logprob passes a trained step makes over its datums (see the module
    docstring): the KL reference's and the post-update policy's."""
    kl = ctx.kl_reference_client is not None and ctx.config.kl_penalty_coef > 0
    return int(kl) + int(ctx.config.compute_post_kl)


def count_tokens(
    ctx: RunContext,
    totals: TokenTotals,
    groups: Sequence[TrajectoryGroup],
    trained: Sequence[TrajectoryGroup],
    *,
    num_datums: int = 0,
) -> tuple[dict[str, float], TokenTotals]:
    """The step's `tokens/*` and `tokens/cumulative/*` metrics, and with `ctx.rates` its
    `cost/step_usd` and `cost/cumulative_usd` (`rlpure.cost`; see the module docstring;
    `num_datums` is the number of datums built from `trained`, for the scoring passes), and
    the totals after the step."""
    trained_ids = {id(group) for group in trained}
    discarded = usage_lib.rollout_usage(g for g in groups if id(g) not in trained_ids)
    training = usage_lib.training_usage(trained)
    scoring = usage_lib.TokenUsage(
        prefill_uncached=_scoring_passes(ctx) * (training.trained + num_datums)
    )
    step = usage_lib.rollout_usage(trained) + training + scoring
    after = TokenTotals(
        tokens=totals.tokens + discarded + step, discarded=totals.discarded + discarded
    )
    metrics: dict[str, float] = {
        **step.metrics("tokens"),
        **after.tokens.metrics("tokens/cumulative"),
    }
    if ctx.rates is not None:
        metrics.update(cost_metrics(step, after.tokens, ctx.rates))
    return metrics, after


def decoder(tokenizer: TokenizerLike | None) -> Callable[[Sequence[int]], str]:
    """Token ids to text with `tokenizer`; without one, the ids joined by spaces."""
    if tokenizer is None:
        return lambda ids: " ".join(str(i) for i in ids)
    return lambda ids: str(tokenizer.decode(list(ids)))
