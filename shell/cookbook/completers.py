"""`tinker_cookbook.completers`: re-exported from `shell.completion`."""

from rlpure.records import (
    ModelInput,
)
from shell.chat import (
    Message,
)
from shell.clients import (
    SamplingClient,
)
from shell.completion import (
    MessageCompleter,
    StopCondition,
    TinkerMessageCompleter,
    TinkerTokenCompleter,
    TokenCompleter,
    TokensWithLogprobs,
    model_input_from_tinker,
    model_input_to_tinker,
    tokens_with_logprobs_from_sequence,
)

__all__ = [
    "Message",
    "MessageCompleter",
    "ModelInput",
    "SamplingClient",
    "StopCondition",
    "TinkerMessageCompleter",
    "TinkerTokenCompleter",
    "TokenCompleter",
    "TokensWithLogprobs",
    "model_input_from_tinker",
    "model_input_to_tinker",
    "tokens_with_logprobs_from_sequence",
]
