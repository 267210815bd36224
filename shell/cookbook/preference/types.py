"""`tinker_cookbook.preference.types`: re-exported from `shell.comparisons._types`."""

from shell.chat import (
    Message,
    get_renderer,
)
from shell.clients import (
    SamplingClient,
)
from shell.comparisons._types import (
    ChatRenderer,
    Comparison,
    ComparisonRenderer,
    ComparisonRendererFromChatRenderer,
    LabeledComparison,
    PreferenceModel,
    PreferenceModelBuilder,
    PreferenceModelBuilderFromChatRenderer,
    PreferenceModelFromChatRenderer,
)
from shell.tokenizers import (
    get_tokenizer,
)

__all__ = [
    "ChatRenderer",
    "Comparison",
    "ComparisonRenderer",
    "ComparisonRendererFromChatRenderer",
    "LabeledComparison",
    "Message",
    "PreferenceModel",
    "PreferenceModelBuilder",
    "PreferenceModelBuilderFromChatRenderer",
    "PreferenceModelFromChatRenderer",
    "SamplingClient",
    "get_renderer",
    "get_tokenizer",
]
