"""`tinker_cookbook.supervised.data`: `conversation_to_datum`, over `shell.sft`."""

from __future__ import annotations

import tinker

from shell.chat import Message, Renderer, TrainOnWhat
from shell.sft import Reduction, conversation_datum

__all__ = ["conversation_to_datum"]


def conversation_to_datum(
    conversation: list[Message],
    renderer: Renderer,
    max_length: int | None,
    train_on_what: TrainOnWhat = TrainOnWhat.ALL_ASSISTANT_MESSAGES,
    reduction: Reduction = "mean",
) -> tinker.Datum:
    """`shell.sft.conversation_datum`."""
    return conversation_datum(conversation, renderer, max_length, train_on_what, reduction)
