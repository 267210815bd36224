"""Scope-structured run logs: a tree of headers, text, tables and formatted objects.

Built inside `init_trace` (a no-op outside one), written as one self-contained HTML page
(`write_html_with_default_style`) and as JSON (`write_trace_json`). `ConversationFormatter`
renders a chat conversation for `log_formatter`. The rollout pages (`shell.training`) and the
cookbook's `utils.logtree` facade are built on it.
"""

from shell.logtree._formatters import CONVERSATION_CSS, ConversationFormatter, message_to_jsonable
from shell.logtree._tree import (
    Formatter,
    Node,
    Theme,
    Trace,
    details,
    flush_trace,
    header,
    init_trace,
    log_formatter,
    log_html,
    log_text,
    optional_enable_logging,
    scope_details,
    scope_disable,
    scope_div,
    scope_header,
    scope_header_decorator,
    table,
    table_from_dict,
    table_from_dict_of_lists,
    write_html_with_default_style,
    write_trace_json,
)

__all__ = [
    "CONVERSATION_CSS",
    "ConversationFormatter",
    "Formatter",
    "Node",
    "Theme",
    "Trace",
    "details",
    "flush_trace",
    "header",
    "init_trace",
    "log_formatter",
    "log_html",
    "log_text",
    "message_to_jsonable",
    "optional_enable_logging",
    "scope_details",
    "scope_disable",
    "scope_div",
    "scope_header",
    "scope_header_decorator",
    "table",
    "table_from_dict",
    "table_from_dict_of_lists",
    "write_html_with_default_style",
    "write_trace_json",
]
