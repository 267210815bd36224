"""One optimisation step of the GRPO loop: trajectory groups → datums → train → metrics.

What `shell.training.train` does with a step's successful groups (`train_on_groups`), and its
parts: optional removal of constant-reward groups → advantages (`rlpure.advantages`, the
configured estimator) → one padded batch (`rlpure.packing.assemble_batch`) → loss aggregation
→ optional KL shaping against a reference sampler (`reference_logprobs_D_T`, `rlpure.kl`) →
`tinker.Datum`s (`shell.datums`, no `mask`: it is not a Tinker loss input) → `train_step` →
metrics → a sampling client of the trained weights, returned together as a `PolicyUpdate`.

Conventions:
- Alignment: every `[D, T]` array is aligned with the batch's targets, as in
  `rlpure.packing` — entry `[d, t]` belongs to target token `t + 1` of datum `d`'s full
  sequence `s` (position `t` predicts `s[t + 1]`), and is 0 on padding (`t >= length_D[d]`
  or `d >= num_datums`).
- Substeps: `train_step` splits the datums into `min(num_substeps, len(datums))` contiguous
  slices as the cookbook's `split_list` does (`split_into_substeps`: 5 datums in 2 substeps
  are `[2, 3]`), one `forward_backward` + `optim_step` each. All calls are **submitted first, then awaited** in submission order, SDK 0.38 style (each call
  returns an `APIFuture` at once; the service orders them by request id). There is no retry
  loop around SDK calls: the SDK retries transient failures itself.
- Metrics of a `PolicyUpdate` (new records; the caller merges them into its step's):
  `overlong/*` with `overlong`, `kl_policy_base` when KL-shaped, `mismatch/rollout_is_*` with
  `mismatch_correction` (`shell.training._corrections`), `batch/num_datums`, `batch/num_trained_groups`,
  `train/<key>` per `forward_backward` metric (summed over substeps for `:sum` keys, averaged
  otherwise), the last `optim_step`'s own metrics under their own keys (merged verbatim, as the
  cookbook does: the local backend's `grad_norm`, the fake's `optim/step`),
  `optim/kl_sample_train_v1|v2` and
  `optim/entropy` (`rlpure.metrics`), then `kl_pre_post_v1|v2` with `compute_post_kl`
  (`post_update_kl_metrics`), in that order.
- Timing: the phases are timed into the current step timer (`shell.timing.span`, a
  no-op outside one) under the cookbook's span names: `prepare_minibatch` (with
  `assemble_training_data`, `kl_vs_base` and, with `mismatch_correction`, our
  `compute_trainer_logprobs`), `train_step` (with, per substep `k`,
  `train/fwd_bwd_substep_{k}_mb_0_enqueue|consume` and `train/optim_substep_{k}_enqueue|consume`,
  the names of the cookbook's streaming step; its sync `train_step` times no call),
  `compute_full_batch_metrics_and_get_sampling_client` (with `compute_kl_sample_train`,
  `save_checkpoint_and_get_sampling_client` / `save_checkpoint` and `compute_post_kl`).
- Clients are `shell.clients.TrainingClient` / `SamplingClient`: Tinker's, the local
  backend's (`shell.local`) or the fakes (`shell.fakes`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence
from typing import NamedTuple, TypeVar

import msgspec
import numpy as np
import tinker

from rlpure import advantages as advantages_lib
from rlpure import metrics as metrics_lib
from rlpure.packing import DatumBatch, assemble_batch
from rlpure.records import TrajectoryGroup
from shell.clients import APIFuture, SamplingClient, TrainingClient
from shell.config import TrainConfig
from shell.datums import to_tinker_datums
from shell.timing import span
from shell.training._corrections import (
    kl_shaped,
    mismatch_corrected,
    overlong_shaped_groups,
)

__all__ = [
    "PolicyUpdate",
    "PreparedDatums",
    "TrainStepOutput",
    "adam_params_from_config",
    "check_provenance",
    "drops_constant_group",
    "post_update_kl_metrics",
    "prepare_datums",
    "records_stability_info",
    "reference_logprobs_D_T",
    "split_into_substeps",
    "train_on_groups",
    "train_step",
]


class TrainStepOutput(msgspec.Struct, frozen=True, kw_only=True):
    """Results of one training step's `forward_backward` and `optim_step` calls, in order."""

    forward_backward: tuple[tinker.ForwardBackwardOutput, ...]
    optim_step: tuple[tinker.OptimStepResponse, ...]


class PolicyUpdate(NamedTuple):
    """What `train_on_groups` did to the policy.

    Attributes:
        sampling_client: a sampling client of the trained weights.
        metrics: the update's metrics, keyed as in the module docstring.
        trained_groups_P: the groups the datums were built from (after constant-reward
            removal), so callers count what was trained without filtering again.
    """

    sampling_client: SamplingClient
    metrics: dict[str, float]
    trained_groups_P: tuple[TrajectoryGroup, ...]


def adam_params_from_config(config: TrainConfig) -> tinker.AdamParams:
    """The `tinker.AdamParams` of a config (lr, betas, eps, weight decay, grad-clip norm)."""
    return tinker.AdamParams(
        learning_rate=config.learning_rate,
        beta1=config.adam_beta1,
        beta2=config.adam_beta2,
        eps=config.adam_eps,
        weight_decay=config.weight_decay,
        grad_clip_norm=config.grad_clip_norm,
    )


_Item = TypeVar("_Item")


def split_into_substeps(items: Sequence[_Item], num_substeps: int) -> list[list[_Item]]:
    """Splits `items` into `min(num_substeps, len(items))` contiguous slices, as the cookbook's
    `split_list` does.

    Slice `k` is `items[e[k]:e[k + 1]]` with edges `e = linspace(0, n, parts + 1)` truncated
    toward zero (float64 edges, exactly as cookbook 0.6.1 computes them): sizes differ by at
    most one and the longer slices come last where the division is uneven (5 items in 2
    slices are `[2, 3]`). Float rounding of the edges makes a few splits differ from exact
    floor division (e.g. 30 items in 22 slices); the cookbook's edges are kept for parity.

    Examples:
        >>> split_into_substeps(list(range(5)), 2)
        [[0, 1], [2, 3, 4]]
        >>> split_into_substeps(list(range(5)), 3)
        [[0], [1, 2], [3, 4]]
    """
    if num_substeps < 1:
        raise ValueError(f"split_into_substeps: num_substeps must be >= 1, got {num_substeps}")
    parts = min(num_substeps, len(items))
    if parts == 0:
        return []
    edges = np.linspace(0, len(items), parts + 1).astype(np.int64).tolist()
    return [list(items[start:stop]) for start, stop in itertools.pairwise(edges)]


def check_provenance(datums: Sequence[tinker.Datum], loss_fn: str) -> None:
    """Refuses datums without provenance spans when `loss_fn` needs them (`stable_reinforce`).

    The cookbook's `_check_provenance`, run on a step's datums before any is sent. A datum has
    no provenance when one of its actions lacks a sampler `sequence_id` (a custom token
    completer must set `TokensWithLogprobs.sequence_id`) or none of its targets is a sampled
    token.

    Raises:
        ValueError: naming the first datum without provenance.
    """
    if loss_fn != "stable_reinforce":
        return
    for d, datum in enumerate(datums):
        if datum.loss_fn_input_spans is None:
            raise ValueError(
                f"loss_fn='stable_reinforce' needs provenance on every datum; datum {d} has "
                "none (one of its actions lacks a sampler sequence_id, which a custom token "
                "completer must set as TokensWithLogprobs.sequence_id, or none of its targets "
                "is a sampled token). Fix the data or train with another loss_fn."
            )


async def train_step(
    training_client: TrainingClient,
    datums: Sequence[tinker.Datum],
    *,
    adam_params: tinker.AdamParams,
    loss_fn: tinker.types.LossFnType,
    loss_fn_config: Mapping[str, float] | None = None,
    num_substeps: int = 1,
) -> TrainStepOutput:
    """One optimisation step: `forward_backward` + `optim_step` per substep, pipelined.

    Every call is submitted before any result is awaited (each returns an `APIFuture` at once),
    so the service sees the whole step queued; results are then awaited in submission order.
    There is no retry loop: the SDK retries transient failures itself.

    Args:
        training_client: the run's training client.
        datums: the step's datums.
        adam_params: optimizer hyper-parameters.
        loss_fn: Tinker loss name.
        loss_fn_config: loss options (e.g. clip thresholds), or None.
        num_substeps: number of contiguous datum slices, each with its own optimizer step.

    Returns:
        The `ForwardBackwardOutput` and `OptimStepResponse` of each substep.

    Raises:
        ValueError: `loss_fn='stable_reinforce'` and a datum without provenance
            (`check_provenance`); nothing is sent then.
    """
    check_provenance(datums, loss_fn)
    with span("train_step"):
        submitted: list[
            tuple[APIFuture[tinker.ForwardBackwardOutput], APIFuture[tinker.OptimStepResponse]]
        ] = []
        for k, chunk in enumerate(split_into_substeps(list(datums), num_substeps)):
            with span(f"train/fwd_bwd_substep_{k}_mb_0_enqueue"):
                fb_future = training_client.forward_backward(chunk, loss_fn, loss_fn_config)
            with span(f"train/optim_substep_{k}_enqueue"):
                optim_future = training_client.optim_step(adam_params)
            submitted.append((fb_future, optim_future))
        forward_backward: list[tinker.ForwardBackwardOutput] = []
        optim_step: list[tinker.OptimStepResponse] = []
        for k, (fb_future, optim_future) in enumerate(submitted):
            with span(f"train/fwd_bwd_substep_{k}_mb_0_consume"):
                forward_backward.append(await fb_future)
            with span(f"train/optim_substep_{k}_consume"):
                optim_step.append(await optim_future)
    return TrainStepOutput(forward_backward=tuple(forward_backward), optim_step=tuple(optim_step))


def _full_sequence(batch: DatumBatch, d: int) -> list[int]:
    """Datum `d`'s whole token sequence `s` (inputs plus the last target), length `L + 1`."""
    length = int(batch.length_D[d])
    inputs = np.asarray(batch.input_tokens_D_T)[d, :length]
    last = np.asarray(batch.target_tokens_D_T)[d, length - 1 : length]
    tokens: list[int] = np.concatenate([inputs, last]).tolist()
    return tokens


async def reference_logprobs_D_T(reference_client: SamplingClient, batch: DatumBatch) -> np.ndarray:
    """Reference-model logprobs of every datum's targets, aligned and padded like the batch.

    Submits one `compute_logprobs` per datum (all at once, then awaits them); entry `[d, t]`
    is the reference logprob of target `t` of datum `d` (`compute_logprobs(s)[1:]`), 0 on
    padding.

    Returns:
        float32 `[D, T]`.
    """
    num_d, num_t = batch.shape
    futures = [
        reference_client.compute_logprobs(tinker.ModelInput.from_ints(_full_sequence(batch, d)))
        for d in range(batch.num_datums)
    ]
    results = await asyncio.gather(*futures)
    out = np.zeros((num_d, num_t), np.float32)
    for d, logprobs in enumerate(results):
        row = [0.0 if lp is None else float(lp) for lp in logprobs[1:]]
        out[d, : len(row)] = row
    return out


def _training_logprobs_D_T(step: TrainStepOutput, batch: DatumBatch) -> np.ndarray:
    """The trainer's logprobs of each datum's targets (from `loss_fn_outputs`), `[D, T]`."""
    outputs = [o for fb in step.forward_backward for o in fb.loss_fn_outputs]
    out = np.zeros(batch.shape, np.float32)
    for d, output in enumerate(outputs):
        row = np.asarray(output["logprobs"].to_numpy(), np.float32)
        out[d, : row.shape[0]] = row
    return out


def _train_output_metrics(step: TrainStepOutput) -> dict[str, float]:
    """Loss metrics summed over substeps (`:sum` keys) or averaged; optimizer metrics last."""
    out: dict[str, float] = {}
    seen: dict[str, list[float]] = {}
    for fb in step.forward_backward:
        for key, value in (fb.metrics or {}).items():
            seen.setdefault(key, []).append(float(value))
    for key, values in seen.items():
        out[f"train/{key}"] = sum(values) if key.endswith(":sum") else sum(values) / len(values)
    if step.optim_step and step.optim_step[-1].metrics:
        for key, value in step.optim_step[-1].metrics.items():
            out[key] = float(value)
    return out


async def post_update_kl_metrics(
    sampling_client: SamplingClient, batch: DatumBatch
) -> dict[str, float]:
    """The cookbook's `compute_post_kl`: how far one update moved the policy on its own data.

    With `q` the batch's sampling logprobs and `p` the updated policy's logprobs of the same
    targets (`reference_logprobs_D_T(sampling_client, batch)`), over the `N` action positions
    (`mask_D_T > 0`): `kl_pre_post_v1 = mean(q - p)`, `kl_pre_post_v2 = ½·mean((q - p)²)`.

    Args:
        sampling_client: a sampling client of the updated weights.
        batch: the batch the update trained on (at least one action token).

    Returns:
        `{"kl_pre_post_v1": ..., "kl_pre_post_v2": ...}`.
    """
    post_D_T = await reference_logprobs_D_T(sampling_client, batch)
    found = metrics_lib.kl_sample_train_metrics(batch.logprobs_D_T, post_D_T, batch.mask_D_T)
    return {
        "kl_pre_post_v1": found["optim/kl_sample_train_v1"],
        "kl_pre_post_v2": found["optim/kl_sample_train_v2"],
    }


def drops_constant_group(config: TrainConfig, group: TrajectoryGroup) -> bool:
    """Whether a loop that filters groups one at a time drops `group`: with
    `remove_constant_reward_groups`, every trajectory got the same total reward (the
    cookbook's `drop_constant_reward_group`, used by its streaming and async loops; the sync
    step filters a whole batch in `train_on_groups` instead, keeping one group when all are
    constant)."""
    if not config.remove_constant_reward_groups:
        return False
    totals = group.get_total_rewards()
    return all(total == totals[0] for total in totals)


class PreparedDatums(NamedTuple):
    """What `prepare_datums` built from a set of groups.

    Attributes:
        batch: the padded batch (advantages aggregated and, with a KL penalty, shaped).
        datums: its `tinker.Datum`s (no `mask`), with provenance spans; with
            `mismatch_correction` their `logprobs` are the trainer's on action tokens (the
            batch's `logprobs_D_T` stay the sampler's).
        metrics: the overlong, KL penalty and mismatch metrics of the options that are on.
    """

    batch: DatumBatch
    datums: list[tinker.Datum]
    metrics: dict[str, float]


async def prepare_datums(
    groups: Sequence[TrajectoryGroup],
    *,
    config: TrainConfig,
    kl_reference_client: SamplingClient | None,
    training_client: TrainingClient | None = None,
) -> PreparedDatums:
    """(Overlong shaping) → advantages → one padded batch → loss aggregation → (KL shaping)
    → (mismatch correction) → datums.

    The cookbook's `prepare_minibatch` without its logging: the part of a step that turns
    groups into training data, shared by the sync step (`train_on_groups`) and the streaming
    minibatches (`shell.training._stream`, once per minibatch). No group is dropped here.
    The steps in parentheses are off by default; `shell.training._corrections` states the
    issue-30 ones (overlong, the KL estimator, the mismatch correction).

    Args:
        groups: at least one trajectory group.
        config: the estimator, aggregation, KL and correction options.
        kl_reference_client: the KL reference's sampler (used when `kl_penalty_coef > 0`).
        training_client: the policy's training client (its `forward` gives the trainer's
            logprobs when `config.mismatch_correction` is set; else unused).

    Returns:
        A `PreparedDatums`.

    Raises:
        ValueError: `config.mismatch_correction` without a `training_client`.
    """
    if config.mismatch_correction is not None and training_client is None:
        raise ValueError(
            "prepare_datums: training_client is required with config.mismatch_correction"
        )
    metrics: dict[str, float] = {}
    with span("prepare_minibatch"):
        if config.overlong is not None:
            groups, overlong_metrics = overlong_shaped_groups(groups, config.overlong)
            metrics.update(overlong_metrics)
        with span("assemble_training_data"):
            advantages_P_G = advantages_lib.compute_advantages(
                groups, estimator=config.advantage_estimator
            )
            batch = assemble_batch(groups, advantages_P_G)
            batch = advantages_lib.aggregate_advantages(
                batch, mode=config.loss_aggregation, length=config.aggregation_length
            )
        if kl_reference_client is not None and config.kl_penalty_coef > 0:
            with span("kl_vs_base"):
                ref_D_T = await reference_logprobs_D_T(kl_reference_client, batch)
                batch, kl_metrics = kl_shaped(batch, ref_D_T, config=config)
            metrics.update({k: float(v) for k, v in kl_metrics.items()})
        gspo = config.training_loss_fn() == "gspo"
        datums = to_tinker_datums(batch, include_mask=False, sequence_ratio_mask=gspo)
        if config.mismatch_correction is not None:
            assert training_client is not None  # checked above
            batch, datums, weight_metrics = await mismatch_corrected(
                batch, datums, training_client=training_client, config=config
            )
            metrics.update(weight_metrics)
    return PreparedDatums(batch=batch, datums=datums, metrics=metrics)


async def train_on_groups(
    groups: Sequence[TrajectoryGroup],
    *,
    training_client: TrainingClient,
    kl_reference_client: SamplingClient | None,
    config: TrainConfig,
    adam_params: tinker.AdamParams,
) -> PolicyUpdate:
    """Advantages → batch → (KL) → datums → train step; returns the new sampling client.

    As the cookbook's sync step: with `remove_constant_reward_groups`, groups whose
    trajectories all got the same total reward are dropped — and when every group is
    constant, the first one is kept and trained on (all-zero advantages unless KL-shaped), so
    every step with a successful group trains.

    Args:
        groups: the step's successful trajectory groups (at least one).
        training_client: the run's training client.
        kl_reference_client: sampling client of the KL reference (required when
            `config.kl_penalty_coef > 0`, else ignored).
        config: the run's options (estimator, aggregation, KL, loss, substeps, post-KL).
        adam_params: optimizer hyper-parameters (`adam_params_from_config(config)`).

    Returns:
        A `PolicyUpdate`: a sampling client of the trained weights (recording stability info
        for `stable_reinforce`) and the update's metrics (the keys in the module docstring,
        plus `kl_pre_post_v1|v2` with `config.compute_post_kl`).

    Raises:
        ValueError: `config.kl_penalty_coef > 0` without a `kl_reference_client`; no groups;
            `stable_reinforce` with a datum without provenance (`check_provenance`).
    """
    if config.kl_penalty_coef > 0 and kl_reference_client is None:
        raise ValueError(
            "train_on_groups: kl_reference_client is required when "
            f"config.kl_penalty_coef > 0 (got {config.kl_penalty_coef})"
        )
    if not groups:
        raise ValueError("train_on_groups: groups is empty (a step without groups is skipped)")
    if config.remove_constant_reward_groups:
        groups = advantages_lib.remove_constant_reward_groups(groups)
    batch, datums, metrics = await prepare_datums(
        groups,
        config=config,
        kl_reference_client=kl_reference_client,
        training_client=training_client,
    )
    metrics["batch/num_datums"] = len(datums)
    metrics["batch/num_trained_groups"] = len(groups)
    step_output = await train_step(
        training_client,
        datums,
        adam_params=adam_params,
        loss_fn=config.training_loss_fn(),
        loss_fn_config=config.loss_fn_config,
        num_substeps=config.num_substeps,
    )
    metrics.update(_train_output_metrics(step_output))
    with span("compute_full_batch_metrics_and_get_sampling_client"):
        with span("compute_kl_sample_train"):
            metrics.update(
                metrics_lib.kl_sample_train_metrics(
                    batch.logprobs_D_T, _training_logprobs_D_T(step_output, batch), batch.mask_D_T
                )
            )
        with span("save_checkpoint_and_get_sampling_client"), span("save_checkpoint"):
            sampling_client = await training_client.save_weights_and_get_sampling_client(
                record_stability_info=records_stability_info(config)
            )
        if config.compute_post_kl:
            with span("compute_post_kl"):
                metrics.update(await post_update_kl_metrics(sampling_client, batch))
    return PolicyUpdate(
        sampling_client=sampling_client, metrics=metrics, trained_groups_P=tuple(groups)
    )


def records_stability_info(config: TrainConfig) -> bool:
    """Whether the run's samplers must record what `stable_reinforce` trains on (the
    cookbook's `Config.records_stability_info`): the loss it trains with, the async one for
    async runs (`TrainConfig.training_loss_fn`)."""
    return config.training_loss_fn() == "stable_reinforce"
