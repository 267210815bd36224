"""The synchronous, on-policy GRPO loop: rollouts → advantages → datums → train → log.

Per step `i` (the cookbook's `do_sync_training`, as a library function recipes call):

1. evaluate greedily on the test set when `eval_every` divides `i` (before training);
2. `dataset.get_batch(i)` → all groups roll out concurrently (`shell.rollouts`) with a
   `TinkerTokenCompleter` over the current sampling client, under the configured strategy;
   failed groups are skipped and counted, a step where every group failed is skipped with a
   warning (no training, same sampling client);
3. optional removal of constant-reward groups → advantages (`rlpure.advantages`, configurable
   estimator) → one padded batch (`rlpure.packing.assemble_batch`) → loss aggregation →
   optional KL shaping against a reference sampler's `compute_logprobs` (`rlpure.kl`) →
   `tinker.Datum`s (`shell.datums`, no `mask`: it is not a Tinker loss input);
4. `forward_backward(datums, loss_fn, loss_fn_config)` + `optim_step(AdamParams)` for each of
   `num_substeps` contiguous slices — **all submitted first, then awaited**, SDK 0.38 style
   (each call returns an `APIFuture` at once; the service orders them by request id) — no retry
   loop around SDK calls (the SDK retries). Steps 3–4 are `train_on_groups`
   (`shell.training._policy_update`, which states their conventions), whose `PolicyUpdate`
   brings back the new sampling client and the metrics merged into the step's;
5. metrics (`rlpure.metrics` names) → `metrics.jsonl`, decoded samples → `samples.jsonl`, the
   progress line; a new sampling client from the trained weights; a checkpoint when
   `save_every` divides `i + 1`, and a final one at the end; the reward-curve PNG last.

Clients are the `shell.clients` protocols: `tinker.ServiceClient`,
`shell.local.LocalServiceClient` and `shell.fakes.FakeServiceClient` all satisfy them.
Resuming: when `log_dir` holds checkpoints, training restarts from the last one (weights,
optimizer state, step index, the loop's PRNG key) and the metrics and samples logged at or
after its step are dropped first. What a run records for that (`config.json`,
`recipe_options.json`), which changes a resume refuses (`ConfigError`), and the training client
a caller may hand over (`OpenedTrainingClient`) are the conventions of
`shell.training._resume`; `train` follows them.

One writer per log dir: `train` holds the log dir's advisory lock (`shell.training._lock`) for
the whole call, so a second run on the same `log_dir` is refused (`LogDirLockedError`, naming the
holder's pid) before it reads or writes anything there.

Randomness: the loop's jax PRNG key (seeded by `config.seed`) is split once per step; the
step's sampling seed is drawn from it and sampler call `n` of the step uses `seed + n`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import msgspec
import tinker
from returns.result import Success
from rich.console import Console

from rlpure import metrics as metrics_lib
from rlpure.records import TrajectoryGroup
from rlpure.render import TokenizerLike
from shell.clients import SamplingClient, ServiceClient, TrainingClient
from shell.completers import TinkerTokenCompleter
from shell.config import TrainConfig
from shell.env import EnvGroupBuilder, RLDataset
from shell.rollouts import (
    GroupOutcome,
    RolloutStrategy,
    batch_rollout_error_metrics,
    do_batch_rollouts,
)
from shell.training._checkpoints import CheckpointRecord, save_checkpoint
from shell.training._lock import hold_log_dir
from shell.training._logs import (
    METRICS_FILE,
    REWARD_CURVE_FILE,
    SAMPLES_FILE,
    JsonlWriter,
    RunProgress,
    decode_rollout_samples,
    headline_eval_metrics,
    plot_reward_curve,
    read_jsonl,
    truncate_jsonl_by_step,
)
from shell.training._policy_update import (
    adam_params_from_config,
    train_on_groups,
)
from shell.training._resume import (
    OpenedTrainingClient,
    callers_training_client,
    checked_last_checkpoint,
    open_training_client,
    prng_key_data,
    prng_key_from_data,
    record_run_options,
)

__all__ = [
    "TrainResult",
    "evaluate",
    "train",
]

logger = logging.getLogger(__name__)


class TrainResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a `train` call did.

    Attributes:
        log_dir: the run's log directory.
        start_step: first step this call ran (> 0 when it resumed).
        end_step: steps completed in total.
        skipped_steps: steps that trained on nothing because every group failed.
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


def _successful(
    builders_P: Sequence[EnvGroupBuilder], outcomes_P: Sequence[GroupOutcome]
) -> tuple[list[EnvGroupBuilder], list[TrajectoryGroup]]:
    kept_builders, kept_groups = [], []
    for builder, outcome in zip(builders_P, outcomes_P, strict=True):
        if isinstance(outcome, Success):
            kept_builders.append(builder)
            kept_groups.append(outcome.unwrap())
    return kept_builders, kept_groups


async def evaluate(
    test_dataset: RLDataset,
    sampling_client: SamplingClient,
    *,
    config: TrainConfig,
    strategy: RolloutStrategy,
    prefix: str = "test/",
) -> dict[str, float]:
    """Greedy evaluation over the whole test dataset.

    Returns:
        The `rlpure.metrics` trajectory metrics of the test groups under `prefix` (e.g.
        `test/env/all/reward/total`, `test/env/all/correct` when envs report `correct`), plus
        `test/num_groups` and the rollout-error counts.
    """
    policy = TinkerTokenCompleter(sampling_client, max_tokens=config.max_tokens, temperature=0.0)
    builders = [b for i in range(len(test_dataset)) for b in test_dataset.get_batch(i)]
    outcomes = await do_batch_rollouts(
        builders,
        policy,
        strategy=strategy,
        max_concurrent_groups=config.max_concurrent_groups,
    )
    kept_builders, groups = _successful(builders, outcomes)
    out: dict[str, float] = {f"{prefix}num_groups": float(len(groups))}
    out.update({f"{prefix}{k}": v for k, v in batch_rollout_error_metrics(outcomes).items()})
    if groups:
        found = metrics_lib.trajectory_metrics(groups, [b.logging_tags() for b in kept_builders])
        out.update({f"{prefix}{k}": float(v) for k, v in found.items()})
    return out


def _decoder(tokenizer: TokenizerLike | None) -> Callable[[Sequence[int]], str]:
    if tokenizer is None:
        return lambda ids: " ".join(str(i) for i in ids)
    return lambda ids: str(tokenizer.decode(list(ids)))


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
    warned_no_signal: bool = False


async def _kl_reference(
    config: TrainConfig,
    service_client: ServiceClient,
    training_client: TrainingClient,
    saved_path: str | None,
) -> tuple[SamplingClient, str | None]:
    """The KL reference sampler and the path of its weights (see `train`'s docstring)."""
    if config.kl_reference_model is not None:
        client = await service_client.create_sampling_client(base_model=config.kl_reference_model)
        return client, None
    if saved_path is None:
        # The policy before RL (= the base model for a fresh LoRA), saved once so that a
        # resumed run measures KL against the same weights.
        saved = await training_client.save_weights_for_sampler("kl_reference")
        saved_path = str(saved.path)
    return await service_client.create_sampling_client(model_path=saved_path), saved_path


async def _run_step(
    run: _Run, step: int, *, dataset: RLDataset, test_dataset: RLDataset | None
) -> tuple[dict[str, Any], list[TrajectoryGroup]]:
    """Evaluation (when due), rollouts and training of one step; returns metrics and groups."""
    config = run.config
    step_start = time.perf_counter()
    run.key, step_key = jax.random.split(run.key)
    seed = int(jax.random.randint(step_key, (), 0, 2**31 - 1))
    metrics: dict[str, Any] = {
        "progress/step": step,
        "progress/done_frac": (step + 1) / run.num_steps,
        "optim/lr": config.learning_rate,
    }
    if test_dataset is not None and config.eval_every and step % config.eval_every == 0:
        metrics.update(
            await evaluate(test_dataset, run.sampling_client, config=config, strategy=run.strategy)
        )

    builders = list(dataset.get_batch(step))
    policy = TinkerTokenCompleter(
        run.sampling_client,
        max_tokens=config.max_tokens,
        temperature=config.temperature,
        seed=seed,
    )
    rollout_start = time.perf_counter()
    outcomes = await do_batch_rollouts(
        builders, policy, strategy=run.strategy, max_concurrent_groups=config.max_concurrent_groups
    )
    metrics["time/rollouts_s"] = time.perf_counter() - rollout_start
    metrics.update(batch_rollout_error_metrics(outcomes))
    kept_builders, groups = _successful(builders, outcomes)
    if not groups:
        logger.warning(
            "Step %d: every group failed (%d groups); skipping the step", step, len(builders)
        )
        metrics["progress/skipped"] = 1
    else:
        metrics.update(
            metrics_lib.trajectory_metrics(groups, [b.logging_tags() for b in kept_builders])
        )
        metrics["batch/num_groups"] = len(groups)
        # constant-reward groups carry no signal under group centring
        metrics["batch/degenerate_groups_frac"] = 1.0 - metrics["env/all/by_group/frac_mixed"]
        train_start = time.perf_counter()
        update = await train_on_groups(
            groups,
            training_client=run.training_client,
            kl_reference_client=run.kl_reference_client,
            config=config,
            adam_params=run.adam_params,
        )
        metrics.update(update.metrics)
        if update.sampling_client is None:
            metrics["batch/num_datums"] = 0
            # once per run, then quietly: a run of constant steps is one finding, not many
            logger.log(
                logging.DEBUG if run.warned_no_signal else logging.WARNING,
                "Step %d: every group has constant reward; not training (further such steps "
                "are logged at DEBUG level)",
                step,
            )
            run.warned_no_signal = True
        else:
            run.sampling_client = update.sampling_client
        metrics["time/train_s"] = time.perf_counter() - train_start
    metrics["time/step_s"] = time.perf_counter() - step_start
    return metrics, groups


async def _checkpoint(run: _Run, step: int, *, final: bool = False) -> CheckpointRecord:
    return await save_checkpoint(
        run.training_client,
        log_dir=run.log_dir,
        step=step,
        rng_key_data=prng_key_data(run.key),
        final=final,
        kl_reference_path=run.kl_reference_path,
    )


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
) -> TrainResult:
    """Runs (or resumes) the GRPO loop described in the module docstring.

    Args:
        config: every option of the run (see `shell.config.FIELD_HELP`).
        dataset: training batches; step `i` uses `dataset.get_batch(i)`.
        service_client: `tinker.ServiceClient`, `LocalServiceClient` or `FakeServiceClient`
            (any `shell.clients.ServiceClient`).
        test_dataset: evaluated greedily every `config.eval_every` steps and at the end (the
            final evaluation is logged as a `metrics.jsonl` line with `step = num_steps` and
            `final_eval = 1`).
        tokenizer: decodes rollouts for `samples.jsonl` (None: token ids are written).
        kl_reference_client: sampling client of the KL reference. Default when
            `kl_penalty_coef > 0`: `config.kl_reference_model` if set, else the policy's weights
            at the start of the run (saved with `save_weights_for_sampler("kl_reference")`, the
            path kept in every checkpoint record so a resumed run uses the same reference).
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

    Returns:
        A `TrainResult`. When `log_dir`'s last checkpoint is already at or past the last step,
        nothing runs (`start_step == end_step`).

    Raises:
        ConfigError: resuming with a changed config field or recipe option (see
            `check_resumable_config`), or a `training_client` not opened for `log_dir`'s last
            checkpoint (see above).
        CheckpointError: a damaged `checkpoints.jsonl`, `metrics.jsonl` or `samples.jsonl`
            (`LogFileError`), naming file, line and field, or states the last checkpoint
            names that are missing or outside the log dir; nothing is rewritten then.
        LogDirLockedError: another run holds `log_dir` (a `ConfigError` naming its pid; see
            `hold_log_dir`). Nothing in the log dir is touched then.
    """
    with hold_log_dir(config.log_dir):
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
) -> TrainResult:
    """`train`'s body, run while this process holds the log dir's lock."""
    log_dir = Path(config.log_dir)
    resume = checked_last_checkpoint(config, recipe_options=recipe_options)
    for log in (METRICS_FILE, SAMPLES_FILE):
        read_jsonl(log_dir / log)  # a damaged log stops the run before anything is rewritten
    client = (
        None
        if training_client is None
        else callers_training_client(training_client, resume=resume, log_dir=log_dir)
    )
    record_run_options(log_dir, config, recipe_options=recipe_options, resuming=resume is not None)
    num_steps = len(dataset) if config.max_steps is None else min(config.max_steps, len(dataset))
    start = 0 if resume is None else resume.step
    if start >= num_steps and resume is not None:
        logger.info("%s: already trained to step %d; nothing to do", log_dir, start)
        curve = plot_reward_curve(log_dir / METRICS_FILE, log_dir / REWARD_CURVE_FILE)
        return TrainResult(
            log_dir=str(log_dir),
            start_step=start,
            end_step=start,
            skipped_steps=(),
            last_metrics={},
            checkpoint=resume,
            reward_curve=None if curve is None else str(curve),
        )
    dropped = truncate_jsonl_by_step(log_dir / METRICS_FILE, keep_below=start)
    truncate_jsonl_by_step(log_dir / SAMPLES_FILE, keep_below=start)
    if resume is not None:
        logger.info(
            "%s: resuming at step %d from %s (dropped %d metrics lines logged after it)",
            log_dir,
            start,
            resume.state_path,
            dropped,
        )

    if client is None:
        client = (await open_training_client(config, service_client, resume)).client
    kl_reference_path = None if resume is None else resume.kl_reference_path
    if config.kl_penalty_coef > 0 and kl_reference_client is None:
        kl_reference_client, kl_reference_path = await _kl_reference(
            config, service_client, client, kl_reference_path
        )
    run = _Run(
        config=config,
        log_dir=log_dir,
        num_steps=num_steps,
        training_client=client,
        sampling_client=await client.save_weights_and_get_sampling_client(),
        kl_reference_client=kl_reference_client,
        kl_reference_path=kl_reference_path,
        key=(
            jax.random.key(config.seed)
            if resume is None
            else prng_key_from_data(resume.rng_key_data)
        ),
        strategy=config.strategy(),
        adam_params=adam_params_from_config(config),
    )
    decode = _decoder(tokenizer)
    skipped: list[int] = []
    last_metrics: dict[str, Any] = {}
    checkpoint = resume
    progress = RunProgress(
        total=num_steps, completed=start, console=console, enabled=config.progress
    )
    with (
        JsonlWriter(log_dir / METRICS_FILE) as metrics_writer,
        JsonlWriter(log_dir / SAMPLES_FILE) as samples_writer,
        progress,
    ):
        if resume is not None:
            progress.note(f"Resuming from step {start} ({resume.state_path})")
        for step in range(start, num_steps):
            eval_due = (
                test_dataset is not None and config.eval_every and step % config.eval_every == 0
            )
            if step == start:
                progress.phase("compiling and running the first step…")
            elif eval_due:
                progress.phase(f"evaluating on the test set, then step {step}…")
            else:
                progress.phase("training", line=False)
            metrics, groups = await _run_step(run, step, dataset=dataset, test_dataset=test_dataset)
            if not groups:
                skipped.append(step)
            elif config.num_groups_to_log:
                samples_writer.write_many(
                    decode_rollout_samples(
                        groups, step=step, decode=decode, max_groups=config.num_groups_to_log
                    )
                )
            metrics_writer.write({"step": step, **metrics})
            progress.step_done(step, metrics)
            last_metrics = metrics
            if config.save_every and (step + 1) % config.save_every == 0 and step + 1 < num_steps:
                checkpoint = await _checkpoint(run, step + 1)
        if test_dataset is not None and config.eval_every:
            progress.phase("final evaluation on the test set…")
            final_eval = await evaluate(
                test_dataset, run.sampling_client, config=config, strategy=run.strategy
            )
            metrics_writer.write({"step": num_steps, "final_eval": 1, **final_eval})
            progress.note(_final_eval_line(final_eval))
        checkpoint = await _checkpoint(run, num_steps, final=True)
    curve = plot_reward_curve(log_dir / METRICS_FILE, log_dir / REWARD_CURVE_FILE)
    return TrainResult(
        log_dir=str(log_dir),
        start_step=start,
        end_step=num_steps,
        skipped_steps=tuple(skipped),
        last_metrics=last_metrics,
        checkpoint=checkpoint,
        reward_curve=None if curve is None else str(curve),
    )
