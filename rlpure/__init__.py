"""rlpure: the pure core. Records, advantages, datum assembly, losses, metrics, grading.

Nothing here performs IO, touches the network, or imports the shell; see `shell` for effects.
"""

from rlpure.packing import DatumBatch, check_datum_batch
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

__all__ = [
    "PARSE_ERROR_MASKED_METRIC_KEY",
    "DatumBatch",
    "ModelInput",
    "RolloutError",
    "StepResult",
    "TokensWithLogprobs",
    "Trajectory",
    "TrajectoryGroup",
    "Transition",
    "check_datum_batch",
    "decode_json",
    "decode_msgpack",
    "encode_json",
    "encode_msgpack",
]
