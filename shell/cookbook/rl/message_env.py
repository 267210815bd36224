"""`tinker_cookbook.rl.message_env`: re-exported from `shell.agents._message_env`."""

from rlpure.records import (
    InitialObservationOverflow,
    StepResult,
    StopReason,
    as_model_input,
)
from shell.agents._message_env import (
    EnvFromMessageEnv,
    MessageEnv,
    MessageStepResult,
    logger,
)
from shell.chat._base import (
    Message,
    ParseTermination,
    Renderer,
    classify_parse_failure,
)
from shell.completion import StopCondition
from shell.env import (
    ActionExtra,
    Env,
    Observation,
)
from shell.rollouts import (
    ParseErrorPolicy,
    RolloutLimits,
)

__all__ = [
    "ActionExtra",
    "Env",
    "EnvFromMessageEnv",
    "InitialObservationOverflow",
    "Message",
    "MessageEnv",
    "MessageStepResult",
    "Observation",
    "ParseErrorPolicy",
    "ParseTermination",
    "Renderer",
    "RolloutLimits",
    "StepResult",
    "StopCondition",
    "StopReason",
    "as_model_input",
    "classify_parse_failure",
    "logger",
]
