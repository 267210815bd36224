"""rlpure: the pure core of RL on language models for the Tinker API.

Immutable records (`rlpure.records`), vectorised advantages and their aggregation
(`rlpure.advantages`), datum assembly into bucketed padded arrays (`rlpure.packing`), Tinker's
losses (`rlpure.losses`), KL shaping (`rlpure.kl`), off-policy corrections, DAPO's overlong
shaping and KL estimators (`rlpure.corrections`), the cookbook's metrics (`rlpure.metrics`)
and prompt rendering (`rlpure.render`); this package re-exports their public names. Nothing
here performs IO, touches the network, or imports the effect shell (`shell`).

Beside the RL core, imported on their own: `rlpure.model` (the local backend's transformer,
sampler, optimiser and byte tokenizer), `rlpure.tasks` (task maths: arithmetic, GSM8K grading)
and `rlpure.testing` (hypothesis strategies and slow references; it needs hypothesis).
"""

from rlpure.advantages import (
    PackedRewards,
    aggregate_advantages,
    aggregate_batch_token_mean,
    aggregate_constant_length,
    aggregate_sequence_token_mean,
    aggregate_token_sum,
    compute_advantages,
    constant_reward_group_mask,
    group_centered_advantages,
    group_normalized_advantages,
    leave_one_out_advantages,
    pack_rewards,
    remove_constant_reward_groups,
)
from rlpure.buckets import bucket_size
from rlpure.corrections import (
    ImportanceWeights,
    KLEstimate,
    importance_weights,
    kl_estimate,
    overlong_penalty,
)
from rlpure.kl import discounted_future_sum, kl_penalty_advantages
from rlpure.losses import (
    LOSSES,
    LossOutput,
    LossSpec,
    cispo_clipped_weight_loss,
    compute_loss,
    cross_entropy_loss,
    dro_quadratic_penalty_loss,
    gspo_token_clipped_surrogate_loss,
    importance_sampling_loss,
    loss_fn_inputs_from_batch,
    ppo_clipped_surrogate_loss,
)
from rlpure.metrics import (
    kl_sample_train_metrics,
    rollout_error_metrics,
    sampling_client_metrics,
    trajectory_metrics,
)
from rlpure.packing import (
    DatumBatch,
    DatumProvenance,
    ProvenanceSpan,
    assemble_batch,
    check_datum_batch,
    datum_arrays,
    trajectory_segments,
)
from rlpure.records import (
    PARSE_ERROR_MASKED_METRIC_KEY,
    ModelInput,
    RolloutError,
    StepResult,
    TokensWithLogprobs,
    Trajectory,
    TrajectoryGroup,
    Transition,
    decode_json,
    decode_msgpack,
    encode_json,
    encode_msgpack,
)
from rlpure.render import (
    ParsedResponse,
    Renderer,
    RoleColonRenderer,
    SupervisedExample,
    get_renderer,
)

__all__ = [
    "LOSSES",
    "PARSE_ERROR_MASKED_METRIC_KEY",
    "DatumBatch",
    "DatumProvenance",
    "ImportanceWeights",
    "KLEstimate",
    "LossOutput",
    "LossSpec",
    "ModelInput",
    "PackedRewards",
    "ParsedResponse",
    "ProvenanceSpan",
    "Renderer",
    "RoleColonRenderer",
    "RolloutError",
    "StepResult",
    "SupervisedExample",
    "TokensWithLogprobs",
    "Trajectory",
    "TrajectoryGroup",
    "Transition",
    "aggregate_advantages",
    "aggregate_batch_token_mean",
    "aggregate_constant_length",
    "aggregate_sequence_token_mean",
    "aggregate_token_sum",
    "assemble_batch",
    "bucket_size",
    "check_datum_batch",
    "cispo_clipped_weight_loss",
    "compute_advantages",
    "compute_loss",
    "constant_reward_group_mask",
    "cross_entropy_loss",
    "datum_arrays",
    "decode_json",
    "decode_msgpack",
    "discounted_future_sum",
    "dro_quadratic_penalty_loss",
    "encode_json",
    "encode_msgpack",
    "get_renderer",
    "group_centered_advantages",
    "group_normalized_advantages",
    "gspo_token_clipped_surrogate_loss",
    "importance_sampling_loss",
    "importance_weights",
    "kl_estimate",
    "kl_penalty_advantages",
    "kl_sample_train_metrics",
    "leave_one_out_advantages",
    "loss_fn_inputs_from_batch",
    "overlong_penalty",
    "pack_rewards",
    "ppo_clipped_surrogate_loss",
    "remove_constant_reward_groups",
    "rollout_error_metrics",
    "sampling_client_metrics",
    "trajectory_metrics",
    "trajectory_segments",
]
