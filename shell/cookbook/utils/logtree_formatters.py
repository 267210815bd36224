"""`tinker_cookbook.utils.logtree_formatters`: re-exported from `shell.logtree._formatters`."""

from shell.errors import (
    RendererError,
)
from shell.logtree._formatters import (
    CONVERSATION_CSS,
    ConversationFormatter,
    message_to_jsonable,
)

__all__ = [
    "CONVERSATION_CSS",
    "ConversationFormatter",
    "RendererError",
    "message_to_jsonable",
]
