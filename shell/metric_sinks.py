"""Where a hand-written loop's config and metrics go: `config.json`, the console, `logs.log`.

For loops outside `shell.training` (a cookbook recipe's own loop, through
`shell.cookbook.utils.ml_log`); the rlpure loop keeps its logs with `shell.training._logs`.

Conventions:
- A config becomes JSON data with `jsonable` (tinker-cookbook 0.6.1's `dump_config`: an
  object's `to_dict()`, `chz` classes and dataclasses field by field, mappings, sequences, enums
  by value, other objects by their public `__dict__`, callables by their dotted name); a value
  JSON cannot hold is written as its type's `str` (`"<class 'object'>"`) in `config.json`.
- Console tables are rich tables rendered to text, handed to the `logging` module at INFO (the
  cookbook's `PrettyPrintLogger`): metric names sorted, `:total` / `:count` aggregates hidden,
  floats with six decimals.
- `configure_root_logging` replaces the root logger's handlers (the cookbook's
  `configure_logging_module`, like `basicConfig(force=True)`): a coloured console line and a
  plain `name:lineno [LEVEL] message` line appended to the file, after the command line.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shlex
import sys
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any

import chz
from rich.console import Console
from rich.table import Table

__all__ = [
    "CONFIG_FILE",
    "HIDDEN_METRIC_SUFFIXES",
    "config_lines_text",
    "configure_root_logging",
    "jsonable",
    "metrics_table_text",
    "write_config_json",
]

CONFIG_FILE = "config.json"
"""A hand-written loop's config, in its log dir."""

HIDDEN_METRIC_SUFFIXES = (":total", ":count")
"""Metric names with these endings are left out of console tables (kept in metrics.jsonl)."""

_LINE_FORMAT = "%(name)s:%(lineno)d [%(levelname)s] %(message)s"
_COLOURS = {
    "DEBUG": "\033[94m",
    "INFO": "\033[92m",
    "WARNING": "\033[93m",
    "ERROR": "\033[91m",
    "CRITICAL": "\033[95m",
}


def jsonable(config: Any) -> Any:
    """`config` as JSON-like data (see the module docstring for the rules, in order)."""
    if hasattr(config, "to_dict"):
        return config.to_dict()
    if chz.is_chz(config):
        return {k: jsonable(v) for k, v in chz.asdict(config).items()}
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {k: jsonable(v) for k, v in dataclasses.asdict(config).items()}
    if isinstance(config, dict):
        return {k: jsonable(v) for k, v in config.items()}
    if isinstance(config, (list, tuple)):
        return [jsonable(item) for item in config]
    if isinstance(config, Enum):
        return config.value
    if hasattr(config, "__dict__"):
        return {k: jsonable(v) for k, v in config.__dict__.items() if not k.startswith(("_", "X_"))}
    if callable(config):
        return f"{config.__module__}.{config.__name__}"
    return config


class _TypeNameEncoder(json.JSONEncoder):
    """Writes a value JSON cannot hold as its type's `str`."""

    def default(self, o: Any) -> Any:
        try:
            return super().default(o)
        except TypeError:
            return str(type(o))


def write_config_json(log_dir: str | os.PathLike[str], config: Any) -> Path:
    """Writes `jsonable(config)` to `<log_dir>/config.json` (indented, replacing the file).

    Returns:
        The file's path.
    """
    data = json.loads(json.dumps(jsonable(config), cls=_TypeNameEncoder))
    path = Path(log_dir) / CONFIG_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


def _captured(console: Console, table_or_lines: list[Any]) -> str:
    with console.capture() as capture:
        for item in table_or_lines:
            console.print(item)
    return capture.get().rstrip()


def metrics_table_text(
    metrics: Mapping[str, Any], *, step: int | None = None, console: Console | None = None
) -> str | None:
    """`metrics` as a rich table (title `Step <step>`), or None when nothing is shown."""
    shown = [
        (key, value)
        for key, value in sorted(metrics.items())
        if not key.endswith(HIDDEN_METRIC_SUFFIXES)
    ]
    if not shown:
        return None
    width = min(max(max(len(key) for key, _ in shown), 20), 60)
    table = Table(show_header=True, header_style="bold magenta")
    table.add_column("Metric", style="cyan", width=width)
    table.add_column("Value", style="green")
    if step is not None:
        table.title = f"Step {step}"
    for key, value in shown:
        table.add_row(key, f"{value:.6f}" if isinstance(value, float) else str(value))
    return _captured(console or Console(), [table])


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text[:128] + " ... " + text[-128:] if len(text) > 256 else text


def config_lines_text(config: Mapping[str, Any], *, console: Console | None = None) -> str:
    """`Configuration:` and one `key: repr` line per entry (a long repr cut in the middle)."""
    lines = ["[bold cyan]Configuration:[/bold cyan]"]
    lines += [f"  {key}: {_short_repr(value)}" for key, value in config.items()]
    return _captured(console or Console(), lines)


class _ColourFormatter(logging.Formatter):
    """The console's format, the level name coloured (the record itself is not changed)."""

    def format(self, record: logging.LogRecord) -> str:
        colour = _COLOURS.get(record.levelname, "")
        record.levelname_colored = f"{colour}{record.levelname}\033[0m"
        return super().format(record)


def configure_root_logging(
    path: str | os.PathLike[str], *, level: int = logging.INFO
) -> logging.Logger:
    """Replaces the root logger's handlers with a coloured console and `path` (appended).

    Returns:
        The root logger.
    """
    console = logging.StreamHandler()
    console.setFormatter(_ColourFormatter(_LINE_FORMAT.replace("levelname", "levelname_colored")))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    file = logging.FileHandler(path, mode="a", encoding="utf-8")
    file.setFormatter(logging.Formatter(_LINE_FORMAT))
    root = logging.getLogger()
    root.setLevel(level)
    for handler in root.handlers[:]:
        root.removeHandler(handler)
        handler.close()
    root.addHandler(console)
    root.addHandler(file)
    root.info(
        "Command line invocation: %s", shlex.join(sys.argv) if sys.argv else "<empty sys.argv>"
    )
    return root
