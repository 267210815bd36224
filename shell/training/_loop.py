"""The synchronous, on-policy GRPO loop: rollouts → advantages → datums → train → log.

Per step `i` (the cookbook's `do_sync_training`, as a library function recipes call):

1. when `eval_every` divides `i` (before training): every evaluator — those of
   `evaluator_builders`, then the test set's (`shell.evaluation.RLTestSetEvaluator`, sampling at
   `eval_temperature`, 1.0 as the cookbook's) — concurrently on the current sampler, their
   metrics merged in that order;
2. `dataset.get_batch(i % len(dataset))` (`shell.datasets.EpochCycledRLDataset`, as the
   cookbook's `main` wraps it: epoch `i // len(dataset)`; the run has
   `min(num_epochs * len(dataset), max_steps)` steps, `resolve_num_steps`) → all groups roll
   out concurrently (`shell.rollouts`, applying `config.effective_termination()` after
   grading, as the cookbook's sync loop; evaluation applies none, as its evaluator) with a
   `TinkerTokenCompleter` over the current sampling client, under the configured strategy;
   failed groups are skipped and counted (`rollout_errors/*`: running totals since the
   `train` call started, under a strategy that catches group errors, as the cookbook's one
   `RolloutErrorCounter`), a step where every group failed is skipped with a warning (no
   training, same sampling client);
3. optional removal of constant-reward groups (all constant: the first is kept and trained on,
   as in the cookbook) → advantages (`rlpure.advantages`, configurable
   estimator) → one padded batch (`rlpure.packing.assemble_batch`) → loss aggregation →
   optional KL shaping against a reference sampler's `compute_logprobs` (`rlpure.kl`) →
   `tinker.Datum`s (`shell.datums`, no `mask`: it is not a Tinker loss input); issue 30's
   options, off by default (overlong shaping, the KL estimator, the mismatch correction,
   `shell.training._corrections`; dynamic sampling, `shell.training._dynamic_sampling`), fit in
   these stages;
4. `forward_backward(datums, loss_fn, loss_fn_config)` + `optim_step(AdamParams)` for each of
   `num_substeps` contiguous slices — **all submitted first, then awaited**, SDK 0.38 style
   (each call returns an `APIFuture` at once; the service orders them by request id) — no retry
   loop around SDK calls (the SDK retries). Steps 3–4 are `train_on_groups`
   (`shell.training._policy_update`, which states their conventions), whose `PolicyUpdate`
   brings back the new sampling client and the metrics merged into the step's;
5. metrics (see Records below) → `metrics.jsonl`, decoded samples → `samples.jsonl`, the
   progress line; a new sampling client from the trained weights; a checkpoint when
   `save_every` divides `i + 1`; after the last step the evaluators once more (a `final_eval`
   line), the run's token totals (a `final_totals` line: the cookbook's `cumulative_metrics()`
   row, `_final_totals_row`) and a final checkpoint; the reward-curve PNG last.

Records (the cookbook's names, so a Tinker user reads them as the cookbook's): a step's
`metrics.jsonl` row holds `progress/batch`, `progress/done_frac`, `optim/lr`, the evaluators'
metrics on eval steps, `env/*` (`rlpure.metrics`), `rollout_errors/*`, the update's metrics
(`shell.training._policy_update`: the optimizer's own keys verbatim, `optim/kl_sample_train_*`,
`optim/entropy`, ...), `tokens/*` and `tokens/cumulative/*` (`shell.training._run.count_tokens`),
our `batch/*` and `train/*` keys, and the `time/*` metrics of the step's spans
(`shell.timing`; `time/total` is the whole step). Spans are named as the cookbook's
(`run_evals`, `sampling`, `do_train_step_and_get_sampling_client`, `train_step`, ...) and
written to `timing_spans.jsonl`, one line per step, after the step's checkpoint when one is
due (its `save_checkpoint_async` span is in that line, not in the metrics row, which is
written first so that a run killed while saving keeps the step's row); the final evaluation
and checkpoint are the line of step `num_steps`. `logs.log` holds the run's log lines and
per-step progress lines (`shell.training._logs.run_log_file`). Modes: with
`config.stream_minibatch_config` each step is `shell.training._stream.run_stream_step`, else
`shell.training._sync.run_sync_step`; with `config.async_config`,
`shell.training._async.run_async` drives the steps. Every mode starts and records a step with
the same parts (`shell.training._steps`: `begin_step`, `finish_step`).

`train` runs as named stages (the cookbook's `do_sync_training`): `_preflight` (everything that
may refuse the run, before the log dir is written), `_record_run` (`config.json`, `logs.log`),
`_drop_logs_after` (a resume's truncated logs), `_open_run` (clients, the fixed
`shell.training._run.RunContext` and the first `RunState`), `_run_steps` (the mode's steps,
each returning the next state), `_finish` (final evaluation, totals, final checkpoint).

Clients are the `shell.clients` protocols: `tinker.ServiceClient`,
`shell.local.LocalServiceClient` and `shell.fakes.FakeServiceClient` all satisfy them.
Resuming: when `log_dir` holds checkpoints, training restarts from the last one (weights,
optimizer state, step index, the loop's PRNG key) and the metrics and samples logged at or
after its step are dropped first. What a run records for that (`config.json`,
`recipe_options.json`) and which changes a resume refuses (`ConfigError`) are the conventions of
`shell.training._resume`, the training client a caller may hand over (`OpenedTrainingClient`)
those of `shell.training._restore`; `train` follows them.

One writer per log dir: `train` holds the log dir's advisory lock (`shell.training._lock`) for
the whole call, so a second run on the same `log_dir` is refused (`LogDirLockedError`, naming the
holder's pid) before it reads or writes anything there.

Randomness: the loop's jax PRNG key (seeded by `config.seed`) is split once per step; the
step's sampling seed is drawn from it and sampler call `n` of the step uses `seed + n`. The
test-set evaluation at step `i` samples with a seed derived from `config.seed` and `i` alone
(`shell.training._steps.eval_seed`), so evaluating changes no training seed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import jax
import msgspec
from rich.console import Console

from rlpure import usage as usage_lib
from rlpure.cost import TokenCostRates
from rlpure.render import TokenizerLike
from shell.clients import SamplingClient, ServiceClient, TrainingClient
from shell.config import TrainConfig
from shell.cost import rates_for_run
from shell.datasets import EpochCycledRLDataset
from shell.env import RLDataset
from shell.errors import ConfigError
from shell.evaluation import RLTestSetEvaluator, SamplingClientEvaluatorBuilder
from shell.rollouts import RolloutErrorCounter, RolloutStrategy
from shell.timing import TIMING_SPANS_FILE, StepTimer, recording, step_timer
from shell.trace_events import TRACE_EVENTS_FILE, start_tracing, stop_tracing
from shell.training._async import check_async_dataset, check_async_state, run_async
from shell.training._checkpoints import CheckpointRecord, prng_key_from_data
from shell.training._dynamic_sampling import check_dynamic_sampling_dataset
from shell.training._lock import hold_log_dir
from shell.training._logs import (
    FINAL_TOTALS_KEY,
    LOGS_FILE,
    METRICS_FILE,
    REWARD_CURVE_FILE,
    SAMPLES_FILE,
    JsonlWriter,
    RunProgress,
    headline_eval_metrics,
    plot_reward_curve,
    read_jsonl,
    run_log_file,
    truncate_jsonl_by_step,
)
from shell.training._policy_update import adam_params_from_config, records_stability_info
from shell.training._restore import (
    OpenedTrainingClient,
    callers_training_client,
    open_training_client,
)
from shell.training._resume import checked_last_checkpoint, record_run_options
from shell.training._run import RunContext, RunState, TokenTotals, decoder
from shell.training._saves import Checkpointer
from shell.training._steps import (
    RunLogs,
    StepsDone,
    evaluates,
    finish_step,
    run_evaluators,
    save_checkpoint_due,
    write_spans,
)
from shell.training._stream import check_stream_dataset, run_stream_step
from shell.training._sync import run_sync_step
from shell.training._trackers import check_trackers, open_trackers

__all__ = [
    "TrainResult",
    "evaluate",
    "resolve_num_steps",
    "train",
]

logger = logging.getLogger(__name__)


class TrainResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a `train` call did.

    Attributes:
        log_dir: the run's log directory.
        start_step: first step this call ran (> 0 when it resumed).
        end_step: steps completed in total (the final checkpoint's step, also when the data ran
            out before it).
        skipped_steps: steps that trained on nothing because every group failed.
        ran_out_at: the step at which the data ran out, before `end_step` (async mode, when
            groups are filtered or fail: steps `ran_out_at .. end_step − 1` never ran, as in the
            cookbook, whose final checkpoint also carries the planned step); None when every
            step ran.
        last_metrics: the metrics of the last step this call ran (empty if none ran).
        checkpoint: the last checkpoint record (None if none was written).
        reward_curve: path of the reward-curve PNG, if one was drawn.
    """

    log_dir: str
    start_step: int
    end_step: int
    skipped_steps: tuple[int, ...]
    last_metrics: dict[str, Any]
    checkpoint: CheckpointRecord | None
    reward_curve: str | None
    ran_out_at: int | None = None


async def evaluate(
    test_dataset: RLDataset,
    sampling_client: SamplingClient,
    *,
    config: TrainConfig,
    strategy: RolloutStrategy,
    prefix: str = "test/",
    seed: int | None = None,
) -> dict[str, float]:
    """One evaluation over the whole test dataset (`shell.evaluation.RLTestSetEvaluator`).

    Samples at `config.eval_temperature` (1.0 by default, as the cookbook's evaluator; 0.0 is
    greedy) with `config.max_tokens`, under `strategy`.

    Returns:
        The `rlpure.metrics` trajectory metrics of the test groups under `prefix` (e.g.
        `test/env/all/reward/total`, `test/env/all/correct` when envs report `correct`), plus
        `test/num_groups` and the rollout-error counts.
    """
    evaluator = _test_set_evaluator(test_dataset, config=config, strategy=strategy, prefix=prefix)
    return await evaluator(sampling_client, seed=seed)


def _test_set_evaluator(
    test_dataset: RLDataset, *, config: TrainConfig, strategy: RolloutStrategy, prefix: str
) -> RLTestSetEvaluator:
    return RLTestSetEvaluator(
        test_dataset,
        max_tokens=config.max_tokens,
        name=prefix.removesuffix("/"),
        strategy=strategy,
        temperature=config.eval_temperature,
        max_concurrent_groups=config.max_concurrent_groups,
    )


def resolve_num_steps(max_steps: int | None, num_batches: int, num_epochs: int = 1) -> int:
    """Total steps of a run: `num_epochs` passes over `num_batches`, capped by `max_steps`
    (the cookbook's `_resolve_end_batch`, with the same warning when the cap is unreachable).

    Examples:
        >>> resolve_num_steps(None, 4, 2), resolve_num_steps(5, 4, 2), resolve_num_steps(3, 4)
        (8, 5, 3)

    Raises:
        ConfigError: `num_epochs < 1`.
    """
    if num_epochs < 1:
        raise ConfigError(f"num_epochs: must be >= 1, got {num_epochs}")
    total = num_batches * num_epochs
    if max_steps is None:
        return total
    if max_steps > total:
        logger.warning(
            "max_steps=%d exceeds num_epochs * len(dataset) = %d * %d = %d; training will stop "
            "after %d steps. Set num_epochs to train for more passes over the dataset.",
            max_steps,
            num_epochs,
            num_batches,
            total,
            total,
        )
    return min(max_steps, total)


async def _kl_reference(
    config: TrainConfig,
    service_client: ServiceClient,
    training_client: TrainingClient,
    saved_path: str | None,
) -> tuple[SamplingClient, str | None]:
    """The KL reference sampler and the path of its weights when the loop saved them.

    `kl_reference_model` / `kl_reference_checkpoint` open a sampler as the cookbook's
    `KLReferenceConfig` does (`create_sampling_client(base_model=..., model_path=...)`);
    `kl_reference_initial_policy` saves the policy's weights at the start of the run once, so
    that a resumed run measures KL against the same weights (`saved_path`, from the
    checkpoint record).
    """
    if not config.kl_reference_initial_policy:
        try:
            client = await service_client.create_sampling_client(
                base_model=config.kl_reference_model, model_path=config.kl_reference_checkpoint
            )
        except ConfigError as err:  # the backend names its own argument (`base_model`)
            field = (
                "kl_reference_checkpoint"
                if config.kl_reference_checkpoint
                else "kl_reference_model"
            )
            raise ConfigError(f"TrainConfig.{field}: {err}") from None
        return client, None
    if saved_path is None:
        saved = await training_client.save_weights_for_sampler("kl_reference")
        saved_path = str(saved.path)
    return await service_client.create_sampling_client(model_path=saved_path), saved_path


def _final_totals_row(ctx: RunContext, totals: TokenTotals) -> dict[str, Any]:
    """The metrics row after the last step (and the final evaluation), before the final
    checkpoint: the run's token totals, as the cookbook's `main` logs
    `CostTracker.cumulative_metrics()` at `step=end_batch` — `tokens/cumulative/<kind>` and
    `tokens/discarded/<kind>`, and with a price table `cost/cumulative_usd` and
    `cost/discarded_usd` — marked `FINAL_TOTALS_KEY` so readers of step rows skip it
    (`shell.training._logs.is_step_row`). A resume of a run that is already complete writes
    nothing (its row is still there); the cookbook drops that row and logs it again, equal."""
    row: dict[str, Any] = {
        "step": ctx.num_steps,
        FINAL_TOTALS_KEY: 1,
        **totals.tokens.metrics("tokens/cumulative"),
        **totals.discarded.metrics("tokens/discarded"),
    }
    if ctx.rates is not None:
        row["cost/cumulative_usd"] = ctx.rates.estimate_usd(totals.tokens)
        row["cost/discarded_usd"] = ctx.rates.estimate_usd(totals.discarded)
    return row


def _final_eval_line(metrics: Mapping[str, float]) -> str:
    shown = [f"{key}: {value:.3f}" for key, value in headline_eval_metrics(metrics).items()]
    return "Final eval | " + " | ".join(shown)


async def train(
    config: TrainConfig,
    *,
    dataset: RLDataset,
    service_client: ServiceClient,
    test_dataset: RLDataset | None = None,
    tokenizer: TokenizerLike | None = None,
    kl_reference_client: SamplingClient | None = None,
    training_client: OpenedTrainingClient | TrainingClient | None = None,
    recipe_options: Mapping[str, Any] | None = None,
    console: Console | None = None,
    evaluator_builders: Sequence[SamplingClientEvaluatorBuilder] = (),
    strategy: RolloutStrategy | None = None,
) -> TrainResult:
    """Runs (or resumes) the GRPO loop described in the module docstring.

    Args:
        config: every option of the run (see `shell.config.FIELD_HELP`).
        dataset: training batches; step `i` uses `dataset.get_batch(i % len(dataset))` (the
            run has `min(config.num_epochs * len(dataset), config.max_steps)` steps).
        service_client: `tinker.ServiceClient`, `LocalServiceClient` or `FakeServiceClient`
            (any `shell.clients.ServiceClient`).
        test_dataset: evaluated (`shell.evaluation.RLTestSetEvaluator`, at
            `config.eval_temperature`) every `config.eval_every` steps before training and
            after the last step (the final evaluation is logged as a `metrics.jsonl` line with
            `step = num_steps` and `final_eval = 1`).
        tokenizer: decodes rollouts for `samples.jsonl` (None: token ids are written).
        kl_reference_client: sampling client of the KL reference, used instead of the one
            the config names. By default, when `kl_penalty_coef > 0`: a sampler on
            `config.kl_reference_model` / `config.kl_reference_checkpoint`, or with
            `config.kl_reference_initial_policy` the policy's weights at the start of the run
            (saved with `save_weights_for_sampler("kl_reference")`, the path kept in every
            checkpoint record so a resumed run uses the same reference).
        training_client: a training client the caller already opened (e.g. to read its
            tokenizer), used instead of opening one: the `OpenedTrainingClient` of
            `open_training_client(config, service_client, last_checkpoint(config.log_dir))`
            (fresh or resumed run), or a bare client (fresh run only: it is trained from
            whatever weights it holds). By default the loop opens the client itself.
        recipe_options: the recipe's own options that define the run (batch shape, data,
            reward, ...; JSON-able values), recorded in `recipe_options.json`; resuming with
            any of them changed is refused like a changed config field. Leave out options a
            resumed run may change (e.g. the evaluation set's size).
        console: where the progress bar and per-step lines go (default: stdout).
        evaluator_builders: zero-argument callables making `shell.evaluation.SamplingClientEvaluator`s
            (the cookbook's `Config.evaluator_builders`): each is built once, at the start,
            and awaited with the current sampling client whenever the test set is evaluated
            (every `config.eval_every` steps and after the last; needs `eval_every > 0`).
            Their metrics and the test set's are merged into the step's line, in order (a later
            key wins; the test set's last).
        strategy: failure handling of rollouts (default `config.strategy()`), for a strategy
            the config's fields cannot name (e.g. extra failure types).

    Returns:
        A `TrainResult` (`start_step == end_step`: the last checkpoint was already at the end).

    Raises:
        ConfigError: resuming with a changed config field or recipe option (see
            `check_resumable_config`), or a `training_client` not opened from `log_dir`'s
            last checkpoint.
        CheckpointError: a damaged `checkpoints.jsonl`, `metrics.jsonl` or `samples.jsonl`
            (`LogFileError`), naming file, line and field, or states the last checkpoint
            names that are missing or outside the log dir; nothing is rewritten then.
        LogDirLockedError: another run holds `log_dir` (a `ConfigError` naming its pid; see
            `hold_log_dir`). Nothing in the log dir is touched then.
    """
    with hold_log_dir(config.log_dir), ExitStack() as log_file:
        return await _locked_train(
            config,
            dataset=dataset,
            service_client=service_client,
            test_dataset=test_dataset,
            tokenizer=tokenizer,
            kl_reference_client=kl_reference_client,
            training_client=training_client,
            recipe_options=recipe_options,
            console=console,
            evaluator_builders=evaluator_builders,
            strategy=strategy,
            log_file=log_file,
        )


async def _locked_train(
    config: TrainConfig,
    *,
    dataset: RLDataset,
    service_client: ServiceClient,
    test_dataset: RLDataset | None,
    tokenizer: TokenizerLike | None,
    kl_reference_client: SamplingClient | None,
    training_client: OpenedTrainingClient | TrainingClient | None,
    recipe_options: Mapping[str, Any] | None,
    console: Console | None,
    evaluator_builders: Sequence[SamplingClientEvaluatorBuilder],
    strategy: RolloutStrategy | None,
    log_file: ExitStack,
) -> TrainResult:
    """`train`'s body, run while this process holds the log dir's lock: its stages in order
    (see the module docstring); `logs.log` is attached to `log_file` once the log dir and
    options are checked (a refused run writes nothing)."""
    log_dir = Path(config.log_dir)
    checked = _preflight(
        config, dataset, training_client=training_client, recipe_options=recipe_options
    )
    resume = checked.resume
    _record_run(config, log_dir, resume=resume, recipe_options=recipe_options, log_file=log_file)
    num_steps = resolve_num_steps(config.max_steps, len(dataset), config.num_epochs)
    start = 0 if resume is None else resume.step
    if resume is not None and start >= num_steps:
        return _already_trained(log_dir, resume)
    _drop_logs_after(log_dir, start, resume=resume)
    ctx, state = await _open_run(
        config,
        checked,
        num_steps=num_steps,
        service_client=service_client,
        test_dataset=test_dataset,
        tokenizer=tokenizer,
        kl_reference_client=kl_reference_client,
        evaluator_builders=evaluator_builders,
        strategy=config.strategy() if strategy is None else strategy,
    )
    cycled = EpochCycledRLDataset(dataset, config.num_epochs)  # step i: batch i % len
    with _run_logs(ctx, start=start, recipe_options=recipe_options, console=console) as logs:
        if resume is not None:
            logs.progress.note(f"Resuming from step {start} ({resume.state_path})")
        done = await _run_steps(ctx, logs, state, start=start, dataset=cycled)
        checkpoint = await _finish(ctx, logs, done.state, start=start)
    curve = plot_reward_curve(log_dir / METRICS_FILE, log_dir / REWARD_CURVE_FILE)
    return TrainResult(
        log_dir=str(log_dir),
        start_step=start,
        end_step=num_steps,
        skipped_steps=done.skipped,
        ran_out_at=done.ran_out_at,
        last_metrics=done.last_metrics,
        checkpoint=checkpoint,
        reward_curve=None if curve is None else str(curve),
    )


class _Checked(NamedTuple):
    """What `_preflight` found: the checkpoint to resume (None: a fresh run), the model's
    prices, and the caller's training client once it fits that checkpoint (None: open one)."""

    resume: CheckpointRecord | None
    rates: TokenCostRates | None
    training_client: TrainingClient | None


def _preflight(
    config: TrainConfig,
    dataset: RLDataset,
    *,
    training_client: OpenedTrainingClient | TrainingClient | None,
    recipe_options: Mapping[str, Any] | None,
) -> _Checked:
    """Everything that may refuse the run, before anything in the log dir is written: the
    resume's options and checkpoint, damaged logs, the price table, the trackers' extras, the
    modes' batch shapes, the caller's training client."""
    log_dir = Path(config.log_dir)
    resume = checked_last_checkpoint(config, recipe_options=recipe_options)
    for log in (METRICS_FILE, SAMPLES_FILE, TIMING_SPANS_FILE):
        read_jsonl(log_dir / log)  # a damaged log stops the run before anything is rewritten
    if config.async_config is not None and resume is not None:
        check_async_state(log_dir)  # likewise the async data's resume rows
    rates = rates_for_run(config.price_table, config.base_model)
    check_trackers(config)
    # issue 15's modes check the dataset against their batch shape before anything runs
    if config.stream_minibatch_config is not None:
        check_stream_dataset(config, dataset)
    if config.async_config is not None:
        check_async_dataset(config, dataset)
    check_dynamic_sampling_dataset(config, dataset)
    client = (
        None
        if training_client is None
        else callers_training_client(training_client, resume=resume, log_dir=log_dir)
    )
    return _Checked(resume=resume, rates=rates, training_client=client)


def _record_run(
    config: TrainConfig,
    log_dir: Path,
    *,
    resume: CheckpointRecord | None,
    recipe_options: Mapping[str, Any] | None,
    log_file: ExitStack,
) -> None:
    """`config.json` and `recipe_options.json`, then `logs.log` attached to `log_file`."""
    record_run_options(log_dir, config, recipe_options=recipe_options, resuming=resume is not None)
    log_file.enter_context(run_log_file(log_dir / LOGS_FILE))


def _already_trained(log_dir: Path, resume: CheckpointRecord) -> TrainResult:
    """A resume whose last checkpoint is at or past the last step: nothing runs."""
    logger.info("%s: already trained to step %d; nothing to do", log_dir, resume.step)
    curve = plot_reward_curve(log_dir / METRICS_FILE, log_dir / REWARD_CURVE_FILE)
    return TrainResult(
        log_dir=str(log_dir),
        start_step=resume.step,
        end_step=resume.step,
        skipped_steps=(),
        last_metrics={},
        checkpoint=resume,
        reward_curve=None if curve is None else str(curve),
    )


def _drop_logs_after(log_dir: Path, start: int, *, resume: CheckpointRecord | None) -> None:
    """Drops the metrics, samples and spans logged at or after step `start` (a resume's).

    Before `metrics.jsonl` loses rows, the file as it was is kept beside it as
    `metrics.jsonl.pre_resume_<start:06d>`, as the cookbook's training store does: the copy is
    written first (under a temporary name, renamed once rows were dropped), so a crash never
    leaves the rows in neither file.
    """
    metrics = log_dir / METRICS_FILE
    backup = metrics.with_name(f"{METRICS_FILE}.pre_resume_{start:06d}")
    staging = backup.with_name(backup.name + ".tmp")
    try:
        if metrics.exists():
            shutil.copyfile(metrics, staging)
        dropped = truncate_jsonl_by_step(metrics, keep_below=start)
        if dropped and staging.exists():
            os.replace(staging, backup)
    finally:
        staging.unlink(missing_ok=True)
    truncate_jsonl_by_step(log_dir / SAMPLES_FILE, keep_below=start)
    truncate_jsonl_by_step(log_dir / TIMING_SPANS_FILE, keep_below=start)
    if resume is not None:
        logger.info(
            "%s: resuming at step %d from %s (dropped %d metrics lines logged after it)",
            log_dir,
            start,
            resume.state_path,
            dropped,
        )
    elif dropped:  # an earlier run here stopped before its first checkpoint: say so
        logger.warning(
            "%s: no checkpoint to resume from, so training starts again at step 0; the %d "
            "metrics lines logged before are kept in %s",
            log_dir,
            dropped,
            backup.name,
        )


async def _open_run(
    config: TrainConfig,
    checked: _Checked,
    *,
    num_steps: int,
    service_client: ServiceClient,
    test_dataset: RLDataset | None,
    tokenizer: TokenizerLike | None,
    kl_reference_client: SamplingClient | None,
    evaluator_builders: Sequence[SamplingClientEvaluatorBuilder],
    strategy: RolloutStrategy,
) -> tuple[RunContext, RunState]:
    """The run's clients (training, KL reference, the first sampler), its fixed context and
    its state at the first step (the resumed checkpoint's key and token totals)."""
    resume = checked.resume
    client = checked.training_client
    if client is None:
        client = (await open_training_client(config, service_client, resume)).client
    kl_reference_path = None if resume is None else resume.kl_reference_path
    if config.kl_penalty_coef > 0 and kl_reference_client is None:
        kl_reference_client, kl_reference_path = await _kl_reference(
            config, service_client, client, kl_reference_path
        )
    sampler = await client.save_weights_and_get_sampling_client(
        record_stability_info=records_stability_info(config)
    )
    log_dir = Path(config.log_dir)
    ctx = RunContext(
        config=config,
        log_dir=log_dir,
        num_steps=num_steps,
        training_client=client,
        kl_reference_client=kl_reference_client,
        kl_reference_path=kl_reference_path,
        strategy=strategy,
        adam_params=adam_params_from_config(config),
        evaluators=tuple(build() for build in evaluator_builders),
        test_evaluator=(
            None
            if test_dataset is None
            else _test_set_evaluator(test_dataset, config=config, strategy=strategy, prefix="test/")
        ),
        # one counter for the call, as the cookbook's main (a resumed run counts afresh)
        error_counter=RolloutErrorCounter() if strategy.catches_group_errors else None,
        termination=config.effective_termination(),
        decode=decoder(tokenizer),
        checkpointer=Checkpointer(
            client,
            service_client=service_client,
            log_dir=log_dir,
            config=config,
            num_steps=num_steps,
            resumed_from=resume,
        ),
        rates=checked.rates,
    )
    return ctx, _first_state(config, resume, sampler)


def _first_state(
    config: TrainConfig, resume: CheckpointRecord | None, sampler: SamplingClient
) -> RunState:
    """The state at the run's first step: a fresh key and totals, or the checkpoint's."""
    if resume is None:
        zero = usage_lib.TokenUsage()
        return RunState(
            key=jax.random.key(config.seed), sampling_client=sampler, totals=TokenTotals(zero, zero)
        )
    return RunState(
        key=prng_key_from_data(resume.rng_key_data),
        sampling_client=sampler,
        totals=TokenTotals(tokens=resume.cumulative_tokens, discarded=resume.discarded_tokens),
    )


@contextmanager
def _run_logs(
    ctx: RunContext,
    *,
    start: int,
    recipe_options: Mapping[str, Any] | None,
    console: Console | None,
) -> Iterator[RunLogs]:
    """The run's writers (`metrics.jsonl`, `samples.jsonl`, `timing_spans.jsonl`, trackers,
    the progress bar), closed when the block ends."""
    log_dir, config = ctx.log_dir, ctx.config
    progress = RunProgress(
        total=ctx.num_steps, completed=start, console=console, enabled=config.progress
    )
    with (
        JsonlWriter(log_dir / METRICS_FILE) as metrics_writer,
        JsonlWriter(log_dir / SAMPLES_FILE) as samples_writer,
        JsonlWriter(log_dir / TIMING_SPANS_FILE) as spans_writer,
        _run_trace(log_dir if config.enable_trace else None),
        open_trackers(config, recipe_options=recipe_options, log_dir=log_dir) as trackers,
        progress,
    ):
        yield RunLogs(
            metrics=metrics_writer,
            samples=samples_writer,
            spans=spans_writer,
            trackers=trackers,
            progress=progress,
        )


@contextmanager
def _run_trace(log_dir: Path | None) -> Iterator[None]:
    """With a log dir (`config.enable_trace`), the run's spans traced into its
    `trace_events.jsonl` (appended on resume) for the block, the running task named `main` as
    in the cookbook's; without, nothing."""
    if log_dir is None:
        yield
        return
    task = asyncio.current_task()
    if task is not None:
        task.set_name("main")
    start_tracing(log_dir / TRACE_EVENTS_FILE)
    try:
        yield
    finally:
        stop_tracing()


def _what_is_evaluated(ctx: RunContext) -> str:
    return "on the test set" if ctx.test_evaluator is not None else "with the evaluators"


async def _run_steps(
    ctx: RunContext, logs: RunLogs, state: RunState, *, start: int, dataset: RLDataset
) -> StepsDone:
    """Steps `start` to `ctx.num_steps` in the run's mode; each step's work, then
    `finish_step`."""
    config = ctx.config
    if config.async_config is not None:  # issue 15's modes: shell.training._async, _stream
        return await run_async(ctx, logs, state, start=start, dataset=dataset)
    step_fn = run_sync_step if config.stream_minibatch_config is None else run_stream_step
    skipped: list[int] = []
    last_metrics: dict[str, Any] = {}
    for step in range(start, ctx.num_steps):
        if step == start:
            logs.progress.phase("compiling and running the first step…")
        elif evaluates(ctx) and step % config.eval_every == 0:
            logs.progress.phase(f"evaluating {_what_is_evaluated(ctx)}, then step {step}…")
        else:
            logs.progress.phase("training", line=False)
        with step_timer() as timer:
            metrics, groups, state = await step_fn(ctx, state, step, dataset=dataset)
        metrics.update(timer.metrics())
        if not groups:
            skipped.append(step)
        await finish_step(ctx, logs, state, step, metrics, groups, timer=timer)
        last_metrics = metrics
    return StepsDone(state=state, last_metrics=last_metrics, skipped=tuple(skipped))


async def _finish(
    ctx: RunContext, logs: RunLogs, state: RunState, *, start: int
) -> CheckpointRecord:
    """After the last step: the final evaluation (only after a step ran, as the cookbook), the
    run's token totals, the final checkpoint; their spans are the line of step `num_steps`."""
    num_steps = ctx.num_steps
    with recording(StepTimer()) as final_timer:
        if evaluates(ctx) and start < num_steps:
            logs.progress.phase(f"final evaluation {_what_is_evaluated(ctx)}…")
            final_eval = await run_evaluators(ctx, state.sampling_client, num_steps)
            final_row = {"step": num_steps, "final_eval": 1, **final_eval}
            logs.metrics.write(final_row)
            logs.trackers.log_metrics(final_row, step=num_steps)
            logs.progress.note(_final_eval_line(final_eval))
        totals_row = _final_totals_row(ctx, state.totals)  # the cookbook's, even when no step ran
        logs.metrics.write(totals_row)
        logs.trackers.log_metrics(totals_row, step=num_steps)
        checkpoint = await save_checkpoint_due(ctx, state, num_steps, final=True)
        assert checkpoint is not None  # a final save is always made
    write_spans(logs, num_steps, final_timer)
    return checkpoint
