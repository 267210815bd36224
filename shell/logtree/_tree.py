"""tinker-cookbook 0.6.1's `utils.logtree`: scope-structured logs written as one HTML page and JSON.

Env code calls `scope_header`, `log_text`, `log_formatter`, `table_from_dict`, ... while it runs;
inside `with init_trace(title, path=...)` those calls build a tree of `Node`s that mirrors the
call tree, written on exit as a self-contained HTML page (inline CSS, no network) and available
as JSON through `Trace.to_dict()` / `write_trace_json`. The API, signatures and semantics are the
cookbook's:

- **No active trace, no effect**: every logging call is a no-op outside `init_trace` (and inside
  `scope_disable()`); `scope_header_decorator` then just calls the function. Argument checks
  that the cookbook makes only while logging (`table(dict)` raising `TypeError`) are likewise
  made only while logging.
- **Task-local scopes**: the trace, the open container and the header depth live in
  `contextvars`, so each `asyncio` task logs into the scope that was open where it was created,
  and concurrent rollouts opening their own `scope_header` each get their own section (sections
  appear in the parent in the order they were opened).
- **Header levels**: the trace title is `<h1>`; each nested `scope_header` is one level deeper,
  capped at `<h6>`.
- **Escaping**: text is escaped wherever it is logged. Deliberate difference: the cookbook
  inserts the summary of a trace's exception block (`Exception: KeyError: 'k'`) unescaped, so
  an exception message holding markup is injected into the page; ours escapes it.
- **JSON**: a node is `{"tag", "attrs", "children"}` plus `"data"` when a formatter attached
  structured data (`Formatter.to_data`), in which case its raw-HTML children are left out.
"""

from __future__ import annotations

import functools
import html
import inspect
import json
import os
import sys
import traceback
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast, overload

__all__ = [
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

F = TypeVar("F", bound=Callable[..., Any])


class Formatter(Protocol):
    """An object that renders itself as HTML, with the CSS that HTML needs.

    It may also define `to_data() -> dict | None`: structured data put in the JSON export
    instead of the raw HTML.
    """

    def to_html(self) -> str:
        """The object's HTML."""
        ...

    def get_css(self) -> str:
        """CSS for that HTML; included once per trace however often the type is logged."""
        ...


@dataclass
class Node:
    """One HTML element of the tree.

    Attributes:
        tag: the element name (`"section"`, `"p"`, `"table"`, ...).
        attrs: its attributes, values unescaped (escaped when written).
        children: child nodes and strings; strings are HTML already (text is escaped when
            logged, `log_html` and formatters insert HTML verbatim).
        data: structured data from a formatter, for the JSON export.
    """

    tag: str
    attrs: dict[str, str] = field(default_factory=dict)
    children: list[Node | str] = field(default_factory=list)
    data: dict[str, Any] | None = field(default=None, repr=False)

    def to_html(self, indent: int = 0) -> str:
        """The element and its subtree as indented HTML (text-only elements on one line)."""
        pad = "  " * indent
        attrs = "".join(f' {k}="{html.escape(v, quote=True)}"' for k, v in self.attrs.items())
        if all(isinstance(child, str) for child in self.children):
            return (
                f"{pad}<{self.tag}{attrs}>{''.join(cast(list[str], self.children))}</{self.tag}>\n"
            )
        parts = [f"{pad}<{self.tag}{attrs}>\n"]
        parts.extend(
            child if isinstance(child, str) else child.to_html(indent + 1)
            for child in self.children
        )
        parts.append(f"{pad}</{self.tag}>\n")
        return "".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The subtree as JSON-ready dicts; with `data`, the raw-HTML children are left out."""
        children = [
            child.to_dict() if isinstance(child, Node) else child
            for child in self.children
            if self.data is None or isinstance(child, Node)
        ]
        out: dict[str, Any] = {"tag": self.tag, "attrs": dict(self.attrs), "children": children}
        if self.data is not None:
            out["data"] = self.data
        return out


@dataclass
class Theme:
    """Styling of the written page.

    Attributes:
        css_text: CSS replacing the built-in style sheet (`None`: the built-in one).
        css_urls: external style sheets to link (the page is no longer self-contained).
        css_vars: CSS custom properties set under `:root` (`--lt-accent`, `--lt-bg`, ...).
    """

    css_text: str | None = None
    css_urls: list[str] = field(default_factory=list)
    css_vars: dict[str, str] = field(default_factory=dict)


class Trace:
    """The document a trace builds: a title, a root `<body>` node and the formatters' CSS.

    Made by `init_trace`; `path` is where the HTML is written on exit (`None`: not written).
    """

    def __init__(self, title: str, path: str | os.PathLike[str] | None, write_on_error: bool):
        self.title = title
        self.path = Path(path) if path is not None else None
        self.write_on_error = write_on_error
        self.started_at = datetime.now()
        self.root = Node("body", {"class": "lt-root"})
        self._formatter_css: dict[str, None] = {}  # insertion-ordered set: stable output

    def _register_formatter_css(self, css: str) -> None:
        if css:
            self._formatter_css.setdefault(css, None)

    def body_html(self, wrap_body: bool = True) -> str:
        """The body's HTML, with its `<body>` tags or (`wrap_body=False`) without them."""
        text = self.root.to_html()
        if wrap_body:
            return text
        return "\n".join(
            line for line in text.split("\n") if "<body" not in line and "</body>" not in line
        )

    def get_html(self) -> str:
        """`body_html(wrap_body=True)`."""
        return self.body_html(wrap_body=True)

    def head_html(
        self, theme: Theme | None = None, title: str | None = None, extra_head: str | None = None
    ) -> str:
        """The inside of `<head>`: title, charset, viewport, the style sheet and formatter CSS."""
        theme = theme if theme is not None else Theme()
        parts = [
            f"<title>{html.escape(title or self.title)}</title>",
            '<meta charset="UTF-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1.0">',
        ]
        parts.extend(
            f'<link rel="stylesheet" href="{html.escape(url, quote=True)}">'
            for url in theme.css_urls
        )
        css = theme.css_text if theme.css_text is not None else _DEFAULT_CSS
        if css or self._formatter_css:
            parts.append("<style>")
            if css:
                parts.append(css)
            if theme.css_vars:
                parts.append(":root {")
                parts.extend(f"  {name}: {value};" for name, value in theme.css_vars.items())
                parts.append("}")
            if self._formatter_css:
                parts.append("\n/* Formatter CSS */")
                parts.extend(self._formatter_css)
            parts.append("</style>")
        if extra_head:
            parts.append(extra_head)
        return "\n".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """`{"title", "started_at" (ISO 8601), "path", "root"}`, JSON-ready."""
        return {
            "title": self.title,
            "started_at": self.started_at.isoformat(),
            "path": str(self.path) if self.path is not None else None,
            "root": self.root.to_dict(),
        }


_DEFAULT_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; line-height: 1.45;
  max-width: 1200px; margin: 0 auto; padding: 14px; background: var(--lt-bg, #f5f5f5);
  color: var(--lt-text, #333); }
.lt-root { background: var(--lt-card, #fff); padding: 1.2rem 1.4rem; border-radius: 8px;
  box-shadow: 0 2px 4px rgba(0, 0, 0, 0.1); }
.lt-title { margin: 0 0 0.5rem; color: var(--lt-accent, #2563eb);
  border-bottom: 2px solid var(--lt-border, #e5e7eb); padding-bottom: 0.5rem; }
.lt-subtitle { color: var(--lt-sub, #666); font-size: 0.875rem; margin-bottom: 1.2rem; }
.lt-section { margin: 0.95rem 0; padding-left: 0.75rem;
  border-left: 2px solid var(--lt-border, #e5e7eb); }
.lt-section-body { margin-top: 0.12rem; }
.lt-section h2, .lt-section h3, .lt-section h4, .lt-section h5, .lt-section h6 {
  margin: 0.2rem 0; line-height: 1.3; color: var(--lt-accent, #2563eb); }
.lt-h2 { font-size: 1.15rem; } .lt-h3 { font-size: 1.05rem; } .lt-h4 { font-size: 0.98rem; }
.lt-h5 { font-size: 0.95rem; } .lt-h6 { font-size: 0.92rem; }
.lt-p { margin: 0.2rem 0; white-space: pre-wrap; }
.lt-details { margin: 0.35rem 0; border: 1px solid var(--lt-border, #e5e7eb); border-radius: 4px;
  padding: 0.35rem 0.45rem; }
.lt-details summary { cursor: pointer; font-weight: 600; }
.lt-details-body { margin: 0.25rem 0 0; padding: 0.35rem 0.45rem; background: var(--lt-bg, #f5f5f5);
  border-radius: 4px; overflow-x: auto; white-space: pre-wrap;
  font-family: var(--lt-mono, ui-monospace, monospace); font-size: 0.875rem; }
.lt-details-body:has(> section, > div), .lt-details-body .lt-section-body {
  white-space: normal; }  /* a scope's body: its markup's indentation is not content */
.lt-table { border-collapse: collapse; width: 100%; margin: 0.6rem 0; font-size: 0.875rem;
  background: #fff; }
.lt-table th { background: var(--lt-table-head-bg, #eef2f7); text-align: left; padding: 0.5rem;
  border-bottom: 1px solid var(--lt-border, #d5dbe3); }
.lt-table td { padding: 0.5rem; border-bottom: 1px solid var(--lt-border, #e5e7eb); }
.lt-table tr:nth-child(even) { background: #f8fafc; }
.lt-table-caption { font-weight: 600; margin-bottom: 0.5rem; }
.lt-exc { background: #fee; border: 2px solid #c00; border-radius: 4px; padding: 0.75rem;
  margin: 0.5rem 0; }
.lt-exc summary { color: #c00; font-weight: 700; cursor: pointer; }
.lt-exc pre { font-family: var(--lt-mono, ui-monospace, monospace); font-size: 0.875rem;
  overflow-x: auto; }
.answer, .reward { font-weight: 600; padding: 0.25rem 0.5rem; border-radius: 4px;
  display: inline-block; margin: 0.25rem 0; }
.answer { background: #dbeafe; color: #1e40af; }
.reward { background: #dcfce7; color: #166534; }
"""

# Task-local state: each asyncio task sees the values current where it was created.
_trace: ContextVar[Trace | None] = ContextVar("logtree_trace", default=None)
_containers: ContextVar[tuple[Node, ...]] = ContextVar("logtree_containers", default=())
_header_levels: ContextVar[tuple[int, ...]] = ContextVar("logtree_header_levels", default=())
_disabled: ContextVar[bool] = ContextVar("logtree_disabled", default=False)


def _logging() -> bool:
    return _trace.get() is not None and not _disabled.get()


def _append(node: Node) -> None:
    containers = _containers.get()
    if not containers:
        raise RuntimeError("logtree: no open container to log into (is a trace active?)")
    containers[-1].children.append(node)


@contextmanager
def _inside(node: Node) -> Iterator[None]:
    token = _containers.set((*_containers.get(), node))
    try:
        yield
    finally:
        _containers.reset(token)


def _html_attrs(attrs: Mapping[str, Any]) -> dict[str, str]:
    """Keyword names to attribute names: `class_` → `class`, `data__x` → `data-x`."""
    out: dict[str, str] = {}
    for key, value in attrs.items():
        name = (
            "class"
            if key == "class_"
            else key.replace("__", "-", 1)
            if key.startswith("data__")
            else key
        )
        out[name] = str(value)
    return out


def _text_node(tag: str, text: str, cls: str | None = None) -> Node:
    return Node(tag, {"class": cls} if cls else {}, [html.escape(text)])


def _write_html(trace: Trace, theme: Theme | None = None) -> None:
    if trace.path is None:
        return
    trace.path.parent.mkdir(parents=True, exist_ok=True)
    trace.path.write_text(
        '<!doctype html>\n<html lang="en">\n<head>\n'
        + trace.head_html(theme=theme)
        + "</head>\n"
        + trace.body_html()
        + "</html>\n",
        encoding="utf-8",
    )


@contextmanager
def init_trace(
    title: str, path: str | os.PathLike[str] | None = None, *, write_on_error: bool = True
) -> Iterator[Trace]:
    """Opens a trace: logging calls in this context (and tasks created in it) build its tree.

    On exit the page is written to `path` (when given). If the body raises, the exception and
    its traceback are logged into the tree, the page is written when `write_on_error`, and the
    exception propagates.

    Args:
        title: the page title and `<h1>`.
        path: the HTML file to write; `None` writes nothing (use `Trace.to_dict()`).
        write_on_error: write the partial page when the body raises.

    Examples:
        >>> with init_trace("Iteration 0") as trace:
        ...     with scope_header("Group 0"):
        ...         log_text("reward 1.0")
        >>> [c["tag"] for c in trace.to_dict()["root"]["children"]]
        ['h1', 'div', 'section']
    """
    trace = Trace(title, path, write_on_error)
    trace.root.children.append(_text_node("h1", title, "lt-title"))
    trace.root.children.append(
        Node(
            "div",
            {"class": "lt-subtitle"},
            [f"Generated {trace.started_at.isoformat(timespec='seconds')}"],
        )
    )
    tokens = (_trace.set(trace), _containers.set((trace.root,)), _header_levels.set((1,)))
    try:
        yield trace
    except BaseException as error:
        trace.root.children.append(_exception_node(error))
        if write_on_error:
            _write_html(trace)
        raise
    else:
        _write_html(trace)
    finally:
        _header_levels.reset(tokens[2])
        _containers.reset(tokens[1])
        _trace.reset(tokens[0])


def _exception_node(error: BaseException) -> Node:
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    summary = _text_node("summary", f"Exception: {type(error).__name__}: {error}")
    return Node("details", {"class": "lt-exc", "open": "open"}, [summary, _text_node("pre", text)])


@contextmanager
def scope_header(title: str, **attrs: Any) -> Iterator[None]:
    """A `<section>` headed by `title` one level below the enclosing scope's header.

    Args:
        title: the header text.
        **attrs: extra attributes of the section (`class_="x"` → `class`, `data__k` →
            `data-k`).
    """
    if not _logging():
        yield
        return
    section = Node("section", {"class": "lt-section", **_html_attrs(attrs)})
    _append(section)
    levels = _header_levels.get()
    level = min(6, (levels[-1] if levels else 1) + 1)
    section.children.append(_text_node(f"h{level}", title, f"lt-h{level}"))
    body = Node("div", {"class": "lt-section-body"})
    section.children.append(body)
    token = _header_levels.set((*levels, level))
    try:
        with _inside(body):
            yield
    finally:
        _header_levels.reset(token)


@overload
def scope_header_decorator(title: str) -> Callable[[F], F]: ...


@overload
def scope_header_decorator(title: F) -> F: ...


def scope_header_decorator(title: str | F) -> F | Callable[[F], F]:
    """Runs the decorated function (sync or async) inside `scope_header(title)`.

    Bare (`@scope_header_decorator`) the header is the function's `__name__`; with a string
    (`@scope_header_decorator("Group Rollout")`) it is that string. Outside a trace the function
    just runs.
    """
    name = title if isinstance(title, str) else title.__name__

    def decorate(fn: F) -> F:
        if inspect.iscoroutinefunction(fn):
            coroutine_fn = cast(Callable[..., Awaitable[Any]], fn)

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with scope_header(name):
                    return await coroutine_fn(*args, **kwargs)

            return cast(F, run_async)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with scope_header(name):
                return fn(*args, **kwargs)

        return cast(F, run)

    return decorate if isinstance(title, str) else decorate(title)


@contextmanager
def scope_div(**attrs: Any) -> Iterator[None]:
    """A `<div>` scope with `attrs` (same naming as `scope_header`); header depth unchanged."""
    if not _logging():
        yield
        return
    div = Node("div", _html_attrs(attrs))
    _append(div)
    with _inside(div):
        yield


@contextmanager
def scope_disable() -> Iterator[None]:
    """Turns logging off inside this scope (and tasks created in it)."""
    token = _disabled.set(True)
    try:
        yield
    finally:
        _disabled.reset(token)


@contextmanager
def optional_enable_logging(enable: bool) -> Iterator[None]:
    """`scope_disable()` when `enable` is false; otherwise changes nothing."""
    if enable:
        yield
        return
    with scope_disable():
        yield


@contextmanager
def scope_details(summary: str) -> Iterator[None]:
    """A collapsible `<details>` scope with `summary` shown while collapsed."""
    if not _logging():
        yield
        return
    body = Node("div", {"class": "lt-details-body"})
    _append(Node("details", {"class": "lt-details"}, [_text_node("summary", summary), body]))
    with _inside(body):
        yield


def log_text(text: str, *, div_class: str | None = None) -> None:
    """Logs `text` (escaped) as a paragraph, or as a `<div class=div_class>` when given."""
    if not _logging():
        return
    _append(_text_node("div", text, div_class) if div_class else _text_node("p", text, "lt-p"))


def log_html(html_text: str, *, div_class: str | None = None) -> None:
    """Logs `html_text` verbatim inside a `<div>` (with `class=div_class` when given)."""
    if not _logging():
        return
    _append(Node("div", {"class": div_class} if div_class else {}, [html_text]))


def log_formatter(formatter: Formatter) -> None:
    """Logs `formatter.to_html()`, its CSS once per trace, and `to_data()` for the JSON export."""
    trace = _trace.get()
    if trace is None or _disabled.get():
        return
    trace._register_formatter_css(formatter.get_css())
    node = Node("div", {}, [formatter.to_html()])
    to_data = getattr(formatter, "to_data", None)
    if callable(to_data):
        node.data = to_data()
    _append(node)


def details(text: str, *, summary: str = "Details", pre: bool = True) -> None:
    """Logs a collapsible block holding `text` (escaped; in a `<pre>` when `pre`)."""
    if not _logging():
        return
    body = _text_node("pre" if pre else "div", text, "lt-details-body")
    _append(Node("details", {"class": "lt-details"}, [_text_node("summary", summary), body]))


def header(text: str, *, level: int | None = None) -> None:
    """Logs a header: `<h{level}>` (clamped to 1..6), or one below the current scope's."""
    if not _logging():
        return
    if level is None:
        levels = _header_levels.get()
        level = min(6, (levels[-1] if levels else 1) + 1)
    level = max(1, min(6, level))
    _append(_text_node(f"h{level}", text, f"lt-h{level}"))


def table(obj: Any, *, caption: str | None = None) -> None:
    """Logs a table from a `pandas.DataFrame`, a list of dicts or a list of lists/tuples.

    A list of dicts takes its columns from the first dict (missing keys are empty cells).
    An empty list logs only the caption.

    Raises:
        TypeError: while logging, `obj` is a dict (use `table_from_dict`) or another type.
    """
    if not _logging():
        return
    if isinstance(obj, dict):
        raise TypeError(
            "table() does not accept dict directly. Use table_from_dict() or "
            "table_from_dict_of_lists()."
        )
    if isinstance(obj, list) and not obj:
        if caption:
            _append(_text_node("div", caption, "lt-table-caption"))
        return
    pandas = sys.modules.get("pandas")  # a DataFrame exists only once pandas is imported
    if pandas is not None and isinstance(obj, pandas.DataFrame):
        _table_from_records(obj.to_dict("records"), caption=caption)
    elif isinstance(obj, list) and isinstance(obj[0], dict):
        _table_from_records(obj, caption=caption)
    elif isinstance(obj, list) and isinstance(obj[0], (list, tuple)):
        _table_from_rows(obj, caption=caption, has_header=False)
    else:
        raise TypeError(f"table() does not support type {type(obj)}")


def table_from_dict(
    data: Mapping[Any, Any],
    *,
    caption: str | None = None,
    key_header: str = "key",
    value_header: str = "value",
    sort_by: str | None = None,
) -> None:
    """Logs a two-column key/value table.

    Args:
        data: the rows, in insertion order unless `sort_by` is `"key"` or `"value"`.
        caption: text above the table.
        key_header: the first column's header.
        value_header: the second column's header.
        sort_by: `"key"`, `"value"` or `None` (any other value also keeps the order).
    """
    if not _logging():
        return
    items = list(data.items())
    if sort_by == "key":
        items.sort(key=lambda item: item[0])
    elif sort_by == "value":
        items.sort(key=lambda item: item[1])
    rows = [[key_header, value_header], *([str(k), str(v)] for k, v in items)]
    _table_from_rows(rows, caption=caption, has_header=True)


def table_from_dict_of_lists(
    columns: Mapping[str, Sequence[Any]],
    *,
    caption: str | None = None,
    order: Sequence[str] | None = None,
) -> None:
    """Logs a table whose columns are `columns`' values, headed by its keys (or `order`).

    Raises:
        ValueError: while logging, the columns differ in length.
    """
    if not _logging() or not columns:
        return
    lengths = {len(values) for values in columns.values()}
    if len(lengths) > 1:
        raise ValueError("All columns must have equal length")
    names = list(order) if order else list(columns)
    rows: list[list[Any]] = [names]
    rows.extend([str(columns[name][i]) for name in names] for i in range(lengths.pop()))
    _table_from_rows(rows, caption=caption, has_header=True)


def _table_from_records(records: Sequence[Mapping[Any, Any]], *, caption: str | None) -> None:
    if not records:
        return
    keys = list(records[0])
    rows: list[list[Any]] = [keys]
    rows.extend([str(record.get(key, "")) for key in keys] for record in records)
    _table_from_rows(rows, caption=caption, has_header=True)


def _table_from_rows(
    rows: Sequence[Sequence[Any]], *, caption: str | None, has_header: bool
) -> None:
    if not rows:
        return
    if caption:
        _append(_text_node("div", caption, "lt-table-caption"))
    parts: list[Node | str] = []
    if has_header:
        head_row = Node("tr", {}, [_text_node("th", str(cell)) for cell in rows[0]])
        parts.append(Node("thead", {}, [head_row]))
        rows = rows[1:]
    body_rows: list[Node | str] = [
        Node("tr", {}, [_text_node("td", str(cell)) for cell in row]) for row in rows
    ]
    parts.append(Node("tbody", {}, body_rows))
    _append(Node("table", {"class": "lt-table"}, parts))


def write_html_with_default_style(
    body_html: str,
    path: str | os.PathLike[str],
    *,
    title: str = "Trace",
    theme: Theme | None = None,
    lang: str = "en",
    extra_head: str | None = None,
) -> None:
    """Writes `body_html` (with or without its `<body>` tags) as a styled page at `path`."""
    head = Trace(title, None, False).head_html(theme=theme, title=title, extra_head=extra_head)
    body = body_html if "<body" in body_html else f"<body>\n{body_html}</body>\n"
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(
        f'<!doctype html>\n<html lang="{html.escape(lang)}">\n<head>\n{head}</head>\n{body}</html>\n',
        encoding="utf-8",
    )


def write_trace_json(trace: Trace, path: str | os.PathLike[str]) -> None:
    """Writes `trace.to_dict()` to `path` as indented JSON."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(trace.to_dict(), indent=2), encoding="utf-8")


def flush_trace() -> bool:
    """Writes the active trace's page now (before its context exits); False when there is none
    or it has no path."""
    trace = _trace.get()
    if trace is None or trace.path is None:
        return False
    _write_html(trace)
    return True
