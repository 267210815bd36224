"""The loop's use of `rlpure.corrections`: overlong shaping, KL estimators, mismatch weights.

Each is off by default (`TrainConfig.overlong`, `kl_penalty_estimator = "k1"`,
`mismatch_correction`), and then `prepare_datums` (`shell.training._policy_update`) builds
exactly the datums it built before these options existed. When on, in `prepare_datums`'s order:

1. `overlong_shaped_groups`: DAPO's soft overlong punishment added to each trajectory's final
   reward (a trajectory's length is its number of sampled tokens, over all its turns), before
   advantages; new group records (the step's own groups, which its `env/*` metrics and token
   counts read, are unchanged). Metrics: `overlong/penalty_mean`, `overlong/penalized_frac`.
2. `kl_shaped`: the cookbook's KL shaping (`rlpure.kl.kl_penalty_advantages`) measures each
   token by `d_t = q_t − ref_t` (k1); with k2 or k3 it measures it by that estimator's value
   `k_t`, handed to the shaping directly (`kl_penalty_advantages_from_estimate`, which keeps
   `k_t`'s float32 precision). As reward shaping only k1 gives an unbiased gradient of the
   KL; k2 and k3 as rewards are biased.
3. `mismatch_corrected`: one `forward` of the training client over the datums built so far
   gives the trainer's logprobs `p`; `rlpure.corrections.importance_weights(q, p, mask)`
   against the sampler's `q` scales the batch's advantages (after aggregation and KL
   shaping, so the weight multiplies the whole advantage of a token), and the datums sent
   carry `p` as their `logprobs` on action tokens (the sampler's values elsewhere), as verl
   (`old_log_prob` recomputed by the actor) and TRL (`old_per_token_logps`) do. Tinker's
   losses read the datum's `logprobs` as the behaviour policy of their own ratio
   `r = exp(lp − logprobs)`; with the sampler's there, `r = p/q` at the forward's weights and
   the gradient would be `−r·w·A` (the ratio counted twice); with `p` it is `r = 1` there and
   the gradient is TIS's/MIS's `−w·A`, and ppo's clip window is centred on the forward's
   policy (verl's decoupled PPO). The batch keeps the sampler's `logprobs_D_T`, so the
   `optim/kl_sample_train_*` and `kl_pre_post_*` metrics still start from the sampler's
   logprobs. Metrics: verl's `mismatch/rollout_is_*`. Aggregation denominators (e.g.
   `sequence_token_mean`) still count masked tokens (verl removes them).

   Which weights the forward sees: in the sync mode, the weights that sampled, before any
   substep (one forward for the whole step; substep `k > 0` then trains on weights
   `k` optimizer steps newer, with a ratio that is no longer 1, as PPO's minibatches after
   the first); in the streaming mode one forward per minibatch, so with `num_substeps > 1`
   a minibatch of substep `k > 0` is scored by the weights after substep `k − 1`'s
   `optim_step` (the weights it trains on), not the ones that sampled, and its weights
   correct that staleness as well; in the async mode the newest weights (the data may be
   several steps old), so the weights also correct staleness. `stable_reinforce` is refused
   with a correction (`TrainConfig`): it reads the sampler's own record server-side
   (provenance spans), and what it takes from the datum's `logprobs` is not public.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import msgspec
import numpy as np
import tinker

from rlpure.corrections import importance_weights, kl_estimate, overlong_penalty
from rlpure.kl import kl_penalty_advantages, kl_penalty_advantages_from_estimate
from rlpure.packing import DatumBatch
from rlpure.records import TrajectoryGroup
from shell.clients import TrainingClient
from shell.config import OverlongConfig, TrainConfig
from shell.datums import to_tinker_datums
from shell.timing import span

__all__ = [
    "MismatchCorrection",
    "kl_shaped",
    "mismatch_corrected",
    "overlong_shaped_groups",
    "trainer_logprobs_D_T",
]


def _sampled_tokens(group: TrajectoryGroup) -> list[int]:
    return [
        sum(len(transition.ac.tokens) for transition in trajectory.transitions)
        for trajectory in group.trajectories_G
    ]


def overlong_shaped_groups(
    groups_P: Sequence[TrajectoryGroup], overlong: OverlongConfig
) -> tuple[list[TrajectoryGroup], dict[str, float]]:
    """The groups with DAPO's overlong penalty added to each trajectory's final reward.

    Returns:
        New groups (same order) and `overlong/penalty_mean` (over trajectories) and
        `overlong/penalized_frac` (trajectories with a penalty below 0).
    """
    lengths = [_sampled_tokens(group) for group in groups_P]
    flat = np.asarray([n for row in lengths for n in row], np.int32)
    penalty = np.asarray(
        overlong_penalty(flat, max_length=overlong.max_length, buffer=overlong.buffer),
        np.float64,
    )
    shaped, start = [], 0
    for group, row in zip(groups_P, lengths, strict=True):
        added = penalty[start : start + len(row)]
        start += len(row)
        rewards = [float(r) + float(p) for r, p in zip(group.final_rewards_G, added, strict=True)]
        shaped.append(msgspec.structs.replace(group, final_rewards_G=tuple(rewards)))
    metrics = {
        "overlong/penalty_mean": float(penalty.mean()) if penalty.size else 0.0,
        "overlong/penalized_frac": float((penalty < 0).mean()) if penalty.size else 0.0,
    }
    return shaped, metrics


def kl_shaped(
    batch: DatumBatch, ref_logprobs_D_T: np.ndarray, *, config: TrainConfig
) -> tuple[DatumBatch, dict[str, jax.Array]]:
    """The cookbook's KL shaping of `batch` against `ref_logprobs_D_T`, each token measured by
    `config.kl_penalty_estimator` (see the module docstring, 2.)."""
    coef, discount = config.kl_penalty_coef, config.kl_discount
    if config.kl_penalty_estimator == "k1":
        return kl_penalty_advantages(batch, ref_logprobs_D_T, coef=coef, discount=discount)
    estimate = kl_estimate(
        batch.logprobs_D_T, ref_logprobs_D_T, batch.mask_D_T, estimator=config.kl_penalty_estimator
    )
    return kl_penalty_advantages_from_estimate(batch, estimate.kl_D_T, coef=coef, discount=discount)


def trainer_logprobs_D_T(output: tinker.ForwardBackwardOutput, batch: DatumBatch) -> np.ndarray:
    """The trainer's logprobs of each datum's targets (`loss_fn_outputs`), padded like the
    batch (`[D, T]`, 0 on padding).

    Raises:
        ValueError: the output has another number of datums than the batch, or a datum's
            logprobs another length than its targets (naming both).
    """
    outputs = output.loss_fn_outputs
    if len(outputs) != batch.num_datums:
        raise ValueError(
            f"trainer_logprobs_D_T: the forward returned {len(outputs)} loss_fn_outputs for "
            f"{batch.num_datums} datums"
        )
    out = np.zeros(batch.shape, np.float32)
    for d, found in enumerate(outputs):
        row = np.asarray(found["logprobs"].to_numpy(), np.float32).reshape(-1)
        length = int(batch.length_D[d])
        if row.shape[0] != length:
            raise ValueError(
                f"trainer_logprobs_D_T: datum {d}'s logprobs have length {row.shape[0]}, its "
                f"targets {length}"
            )
        out[d, :length] = row
    return out


class MismatchCorrection(NamedTuple):
    """What `mismatch_corrected` returns.

    Attributes:
        batch: the batch with its advantages scaled by the weights; its `logprobs_D_T` are
            still the sampler's (for `optim/kl_sample_train_*` and the post-update KL).
        datums: the datums to send: the corrected advantages, and as `logprobs` the
            trainer's on the action tokens (the batch's values elsewhere).
        metrics: the weights' metrics (`mismatch/rollout_is_*`).
    """

    batch: DatumBatch
    datums: list[tinker.Datum]
    metrics: dict[str, float]


async def mismatch_corrected(
    batch: DatumBatch,
    datums: list[tinker.Datum],
    *,
    training_client: TrainingClient,
    config: TrainConfig,
) -> MismatchCorrection:
    """The batch with its advantages scaled by the importance weights between the trainer's
    logprobs (one `forward` of `datums`, the batch's datums as built so far) and the
    sampler's, and the datums to send, whose `logprobs` are the trainer's (see the module
    docstring, 3.).

    Raises:
        ValueError: `config.mismatch_correction` is None; the forward's outputs do not match
            the batch (`trainer_logprobs_D_T`).
    """
    correction = config.mismatch_correction
    if correction is None:
        raise ValueError("mismatch_corrected: config.mismatch_correction is None")
    with span("compute_trainer_logprobs"):
        output = await training_client.forward(
            datums, config.training_loss_fn(), config.loss_fn_config
        )
    trainer_D_T = trainer_logprobs_D_T(output, batch)
    weights = importance_weights(
        batch.logprobs_D_T,
        trainer_D_T,
        batch.mask_D_T,
        level=correction.level,
        mode=correction.mode,
        cap=correction.cap,
    )
    advantages = np.asarray(batch.advantages_D_T, np.float32) * np.asarray(
        weights.weights_D_T, np.float32
    )
    corrected = msgspec.structs.replace(batch, advantages_D_T=advantages)
    # the losses' own ratio exp(lp − logprobs) is then 1 at the weights of this forward
    behaviour = np.where(
        np.asarray(batch.mask_D_T) > 0, trainer_D_T, np.asarray(batch.logprobs_D_T, np.float32)
    )
    sent = to_tinker_datums(
        msgspec.structs.replace(corrected, logprobs_D_T=behaviour.astype(np.float32)),
        include_mask=False,
        sequence_ratio_mask=config.training_loss_fn() == "gspo",
    )
    metrics = {key: float(value) for key, value in weights.metrics.items()}
    return MismatchCorrection(batch=corrected, datums=sent, metrics=metrics)
