"""Immutable records for what flows through RL: observations, actions, transitions, groups.

Conventions:
- Records are `msgspec.Struct(frozen=True, kw_only=True)` with the field names of
  tinker-cookbook's `rl/types.py`; sequence fields are tuples; token fields are read-only numpy
  arrays (`int32` ids, `float32` logprobs), copied on construction.
- `__post_init__` converts and validates each field (also when decoding). These records are
  host-side only, never traced by `jit`, so STYLE's rule against validating there does not apply.
- Errors name the record and the field: `TokensWithLogprobs.logprobs: length 3 != tokens length 4`.
- Cookbook inputs (a `tinker.ModelInput`, lists of ids, the cookbook's `TokensWithLogprobs`, bool
  metrics) are converted at construction (`as_model_input`, `as_tokens_with_logprobs`).
- `encode_msgpack` / `decode_msgpack` and `encode_json` / `decode_json` round-trip any record.
"""

from rlpure.records._codec import decode_json, decode_msgpack, encode_json, encode_msgpack
from rlpure.records._cookbook_inputs import (
    ModelInputLike,
    TokensWithLogprobsLike,
    as_model_input,
    as_tokens_with_logprobs,
)
from rlpure.records._fields import Logs, Metrics, StopCondition, TokenIds, as_stop_condition
from rlpure.records._records import (
    PARSE_ERROR_MASKED_METRIC_KEY,
    STOP_METRIC_PREFIX,
    InitialObservationOverflow,
    RolloutError,
    StepResult,
    StopReason,
    Trajectory,
    TrajectoryGroup,
    Transition,
)
from rlpure.records._tokens import ModelInput, TokensWithLogprobs

__all__ = [
    "PARSE_ERROR_MASKED_METRIC_KEY",
    "STOP_METRIC_PREFIX",
    "InitialObservationOverflow",
    "Logs",
    "Metrics",
    "ModelInput",
    "ModelInputLike",
    "RolloutError",
    "StepResult",
    "StopCondition",
    "StopReason",
    "TokenIds",
    "TokensWithLogprobs",
    "TokensWithLogprobsLike",
    "Trajectory",
    "TrajectoryGroup",
    "Transition",
    "as_model_input",
    "as_stop_condition",
    "as_tokens_with_logprobs",
    "decode_json",
    "decode_msgpack",
    "encode_json",
    "encode_msgpack",
]
