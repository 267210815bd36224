"""Run logs: `metrics.jsonl`, decoded rollout samples, `logs.log`, the progress line and the
reward curve.

Conventions:
- `metrics.jsonl` holds one JSON object per training step, `{"step": i, ...metrics}`, appended
  and flushed (and `fsync`ed) as each step ends, so a killed run loses at most the step in
  flight. On resume the loop drops lines whose `step` is at or after the checkpoint it resumes
  from (`truncate_jsonl_by_step`), rewriting the file atomically (temporary file + `os.replace`)
  so earlier lines are never lost, whatever moment a second kill lands.
- Two rows follow the last step's, both at `step = num_steps`: the final evaluation's (marked
  `final_eval`, when the run evaluates) and the final totals row (marked `FINAL_TOTALS_KEY`,
  the cookbook's `CostTracker.cumulative_metrics()` row: `tokens/cumulative/<kind>`,
  `tokens/discarded/<kind>`, and `cost/cumulative_usd`, `cost/discarded_usd` with a price
  table). Readers of step rows skip both (`is_step_row`); the reward curve draws the final
  evaluation's test values and nothing of the totals row. Both are at the run's last step, so a resume that continues past
  it drops them with the rest (`truncate_jsonl_by_step`) and writes them anew at its end.
- A line cut short by a kill (no trailing newline, not valid JSON) can only be the last one; it
  is dropped with a warning. An unreadable line anywhere else, or a `step` that is not an
  integer, is a `LogFileError` naming the file, the line and the field (a damaged log is a data
  error the CLI reports in one line, not a traceback).
- `samples.jsonl` holds decoded rollouts (`decode_rollout_samples`), a few groups per step, with
  the same `step` key and the same truncation on resume.
- `logs.log` (`LOGS_FILE`) holds the run's log lines in the cookbook's file format
  (`name:lineno [LEVEL] message`), appended across calls and resumes: `run_log_file` attaches a
  `FileHandler` at INFO to the root logger for the duration of a `train` call and removes it
  after (one handler per file: a handler already on the root logger for the same file is
  reused, not doubled). The call's first line is the command line, as the cookbook's. Each
  step's progress line goes to the file too, through `STEPS_LOGGER`, which does not propagate
  (the console already prints it). Unlike the cookbook's `configure_logging_module`, nothing
  else of the process's logging is replaced: when the root logger is above INFO, it is lowered
  to INFO for the call while each of its handlers is raised to the old level, so the console
  shows what it showed before (and warnings still reach stderr when no handler was configured).
- The reward curve (`REWARD_CURVE_FILE`) is drawn by `shell.plots`, as `rlpure report`'s.
- Nothing here reads the environment: secrets such as `TINKER_API_KEY` never reach a log.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shlex
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from rlpure.records import TrajectoryGroup
from shell.errors import CheckpointError
from shell.plots import Panel, metric_curve, plot_step_curves

__all__ = [
    "FINAL_TOTALS_KEY",
    "LOGS_FILE",
    "LOG_LINE_FORMAT",
    "METRICS_FILE",
    "REWARD_CURVE_FILE",
    "SAMPLES_FILE",
    "STEPS_LOGGER",
    "JsonlWriter",
    "LogFileError",
    "RunProgress",
    "decode_rollout_samples",
    "finite_json",
    "format_progress_line",
    "headline_eval_metrics",
    "is_step_row",
    "plot_reward_curve",
    "read_jsonl",
    "run_log_file",
    "truncate_jsonl_by_step",
]

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
"""One JSON object of metrics per training step, in the log dir."""
SAMPLES_FILE = "samples.jsonl"
"""Decoded rollout samples per step, in the log dir."""
REWARD_CURVE_FILE = "reward_curve.png"
"""The train/test reward curve, drawn at the end of a run."""
LOGS_FILE = "logs.log"
"""The run's log lines, appended by every `train` call on the log dir."""
LOG_LINE_FORMAT = "%(name)s:%(lineno)d [%(levelname)s] %(message)s"
"""The cookbook's `logs.log` line format."""
STEPS_LOGGER = "shell.training.steps"
"""The logger of the per-step progress lines (file only: it does not propagate)."""
FINAL_TOTALS_KEY = "final_totals"
"""The marker (value 1) of the final totals row in `metrics.jsonl` (see the module docstring)."""


def _same_file(handler: logging.Handler, path: Path) -> bool:
    return isinstance(handler, logging.FileHandler) and Path(handler.baseFilename) == path


@contextmanager
def run_log_file(path: str | os.PathLike[str], *, level: int = logging.INFO) -> Iterator[Path]:
    """Appends the process's log records at `level` and above to `path` for the block (see the
    module docstring); everything it changed is restored when the block ends.

    Yields:
        The absolute path of the log file.
    """
    path = Path(path).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    steps = logging.getLogger(STEPS_LOGGER)
    saved = (root.level, steps.level, steps.propagate)
    handler = next((h for h in root.handlers if _same_file(h, path)), None)
    ours = handler is None
    if handler is None:
        handler = logging.FileHandler(path, mode="a", encoding="utf-8")
        handler.setLevel(level)
        handler.setFormatter(logging.Formatter(LOG_LINE_FORMAT))
    raised: list[tuple[logging.Handler, int]] = []
    fallback = None
    if root.getEffectiveLevel() > level:  # open the root to `level` for the file alone
        for other in root.handlers:
            if other.level < root.level:
                raised.append((other, other.level))
                other.setLevel(root.level)
        if not root.handlers and logging.lastResort is not None:
            fallback = logging.lastResort  # what logging used: warnings stay on stderr
            root.addHandler(fallback)
        root.setLevel(level)
    if ours:
        root.addHandler(handler)
    steps.setLevel(level)
    steps.propagate = False
    steps.addHandler(handler)
    try:
        # to the file alone: the console (the CLI logs INFO to stderr) stays quiet
        handler.handle(
            logging.LogRecord(
                __name__,
                logging.INFO,
                __file__,
                sys._getframe().f_lineno,
                "Command line invocation: %s",
                (shlex.join(sys.argv),),
                None,
            )
        )
        yield path
    finally:
        steps.removeHandler(handler)
        steps.setLevel(saved[1])
        steps.propagate = saved[2]
        if ours:
            root.removeHandler(handler)
            handler.close()
        if fallback is not None:
            root.removeHandler(fallback)
        for other, other_level in raised:
            other.setLevel(other_level)
        root.setLevel(saved[0])


def _json_default(value: Any) -> Any:
    """JSON for numpy / jax scalars and small arrays that end up in metrics."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"metrics: {type(value).__name__} is not JSON serialisable")


def _finite_or_none(value: Any) -> Any:
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        value = value.item()  # numpy / jax scalars, NaN included
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf; keep the file parseable by every reader
    return value


def finite_json(value: Any, *, indent: int | None = None) -> str:
    """`value` as JSON text, non-finite floats (at any depth) written as null: JSON has no
    NaN/inf, and a summary holding `NaN` breaks strict readers.

    Examples:
        >>> finite_json({"loss": float("nan"), "steps": [1, float("inf")]})
        '{"loss": null, "steps": [1, null]}'
    """

    def finite(item: Any) -> Any:
        if isinstance(item, Mapping):
            return {key: finite(inner) for key, inner in item.items()}
        if isinstance(item, (list, tuple)):
            return [finite(inner) for inner in item]
        return _finite_or_none(item)

    return json.dumps(finite(value), indent=indent, allow_nan=False, default=_json_default)


class JsonlWriter:
    """Appends JSON objects to a file, one per line, flushed and fsynced after each write."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")

    def write(self, record: Mapping[str, Any]) -> None:
        if self._file is None:
            raise ValueError(f"JsonlWriter({self.path}): write after close")
        clean = {k: _finite_or_none(v) for k, v in record.items()}
        self._file.write(json.dumps(clean, default=_json_default, allow_nan=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def write_many(self, records: Iterable[Mapping[str, Any]]) -> None:
        for record in records:
            self.write(record)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LogFileError(CheckpointError, ValueError):
    """A log file of a log directory is damaged; the message names the file, line and field.

    A `CheckpointError` (it blocks resuming the log dir) and a `ValueError` (what `read_jsonl`
    raised before it had its own class).
    """


def _numbered_records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """`(line number, record)` of each JSON object line of `path` (see `read_jsonl`)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise LogFileError(f"{path}: not UTF-8 text ({err})") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):
                logger.warning("%s: dropping torn last line %d (%s)", path, number, err)
                break
            raise LogFileError(f"{path}: line {number} is not valid JSON: {err}") from None
        if not isinstance(record, dict):
            raise LogFileError(f"{path}: line {number} is not a JSON object")
        step = record.get("step", 0)
        if isinstance(step, bool) or not isinstance(step, int):
            raise LogFileError(
                f"{path}: line {number}: field 'step': expected an integer, got {step!r}"
            )
        records.append((number, record))
    return records


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Reads a JSONL file (missing file: empty list), dropping a torn last line.

    Raises:
        LogFileError: a line other than the last is not a JSON object, or a record's `step` is
            not an integer (names file, line and field).
    """
    path = Path(path)
    if not path.exists():
        return []
    return [record for _, record in _numbered_records(path)]


def truncate_jsonl_by_step(path: str | os.PathLike[str], *, keep_below: int) -> int:
    """Keeps only the records whose `step` is `< keep_below`, rewriting the file atomically.

    Returns:
        The number of records dropped (0 also when the file does not exist).

    Raises:
        LogFileError: see `read_jsonl` (the file is left as it is).
    """
    path = Path(path)
    if not path.exists():
        return 0
    records = read_jsonl(path)
    kept = [r for r in records if r.get("step", -1) < keep_below]
    raw_lines = sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    if len(kept) == raw_lines:
        return 0
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for record in kept:
            f.write(json.dumps(record, allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return raw_lines - len(kept)


def is_step_row(row: Mapping[str, Any]) -> bool:
    """Whether a `metrics.jsonl` row is a training step's: neither the final evaluation's
    (`final_eval`) nor the final totals row (`FINAL_TOTALS_KEY`).

    Examples:
        >>> is_step_row({"step": 2, "progress/batch": 2})
        True
        >>> is_step_row({"step": 3, "final_eval": 1}), is_step_row({"step": 3, "final_totals": 1})
        (False, False)
    """
    return "final_eval" not in row and FINAL_TOTALS_KEY not in row


def format_progress_line(step: int, metrics: Mapping[str, Any]) -> str:
    """The per-step line: `Step  3 | reward: 0.412 | degenerate: 25% | datums: 96`.

    Reads `env/all/reward/total`, `batch/degenerate_groups_frac` and `batch/num_datums`;
    absent values print as `-`. Adds `| skipped` for a step that trained on nothing.

    Examples:
        >>> format_progress_line(3, {"env/all/reward/total": 0.4123,
        ...     "batch/degenerate_groups_frac": 0.25, "batch/num_datums": 96})
        'Step  3 | reward: 0.412 | degenerate: 25% | datums: 96'
    """

    def number(key: str, spec: str) -> str:
        value = metrics.get(key)
        return "-" if value is None else format(value, spec)

    line = (
        f"Step {step:>2} | reward: {number('env/all/reward/total', '.3f')} | "
        f"degenerate: {number('batch/degenerate_groups_frac', '.0%')} | "
        f"datums: {number('batch/num_datums', 'd')}"
    )
    test_reward = metrics.get("test/env/all/reward/total")
    if test_reward is not None:
        line += f" | test reward: {test_reward:.3f}"
    if metrics.get("progress/skipped"):
        line += " | skipped"
    return line


def headline_eval_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The evaluation metrics a summary shows: `test/env/all/.../total` and `.../correct`, keyed
    without the `test/env/all/` prefix (numbers only).

    Examples:
        >>> headline_eval_metrics({"test/env/all/reward/total": 1.0, "test/env/all/n": 4})
        {'reward/total': 1.0}
    """
    return {
        key.removeprefix("test/env/all/"): float(value)
        for key, value in metrics.items()
        if key.startswith("test/env/all/")
        and key.rsplit("/", 1)[-1] in ("total", "correct")
        and isinstance(value, (int, float))
    }


def eval_metric_before_after(
    metrics_path: str | os.PathLike[str], key: str
) -> tuple[float | None, float | None]:
    """An evaluation metric before and after a run, from its `metrics.jsonl`: the step-0 row's
    `key` (evaluated before any training) and the last final evaluation's (`final_eval`);
    `None` for one the file does not hold (no such rows, or a missing file).

    Raises:
        LogFileError: see `read_jsonl`.
    """
    records = [r for r in read_jsonl(metrics_path) if r.get(key) is not None]
    before = next((r[key] for r in records if r["step"] == 0 and not r.get("final_eval")), None)
    finals = [r[key] for r in records if r.get("final_eval")]
    return before, (finals[-1] if finals else None)


class RunProgress:
    """A rich progress bar over training steps, printing the per-step line above it.

    The bar (phase, steps done of total, elapsed time, ETA) is shown only on a terminal; the
    lines are always printed (to `console`). `phase(text)` names what the run is doing now
    ("compiling…", "evaluating…"): a line when the phase changes and the bar's label.
    `step_done` advances the counter before it prints the step's line, so the two agree.
    """

    def __init__(
        self,
        *,
        total: int,
        completed: int = 0,
        console: Console | None = None,
        enabled: bool = True,
    ) -> None:
        self.console = console if console is not None else Console()
        self.enabled = enabled
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
            disable=not (enabled and self.console.is_terminal),
            transient=True,
        )
        self._task = self._progress.add_task("training", total=total, completed=completed)
        self._phase = "training"

    def __enter__(self) -> RunProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def phase(self, text: str, *, line: bool = True) -> None:
        """Shows `text` as what the run does now: the bar label, and (with `line`) one printed
        line when it changes."""
        if text == self._phase:
            return
        self._phase = text
        self._progress.update(self._task, description=text)
        if line and self.enabled:
            self.console.print(f"[dim]{text}[/dim]", highlight=False)

    def step_done(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Counts step `step` as done, then prints its line."""
        self._progress.advance(self._task)
        self._progress.refresh()
        if self.enabled:
            self.console.print(format_progress_line(step, metrics), highlight=False)

    def note(self, text: str) -> None:
        """Prints `text` above the bar."""
        if self.enabled:
            self.console.print(text, highlight=False)


def decode_rollout_samples(
    groups_P: Sequence[TrajectoryGroup],
    *,
    step: int,
    decode: Callable[[Sequence[int]], str],
    max_groups: int,
) -> list[dict[str, Any]]:
    """Decoded rollouts of the first `max_groups` groups, one record per trajectory.

    Returns:
        Records `{"step", "group", "traj", "total_reward", "final_reward", "turns": [{"ob",
        "ac", "reward", "stop_reason"}]}` with observations and actions decoded to text.
    """
    samples = []
    for p, group in enumerate(groups_P[:max_groups]):
        totals = group.get_total_rewards()
        for g, traj in enumerate(group.trajectories_G):
            samples.append(
                {
                    "step": step,
                    "group": p,
                    "traj": g,
                    "total_reward": totals[g],
                    "final_reward": group.final_rewards_G[g],
                    "turns": [
                        {
                            "ob": decode(t.ob.to_ints()),
                            "ac": decode(t.ac.tokens.tolist()),
                            "reward": t.reward,
                            "stop_reason": t.ac.stop_reason,
                        }
                        for t in traj.transitions
                    ],
                }
            )
    return samples


_CURVES = (
    ("env/all/reward/total", "train reward (mean total)"),
    ("test/env/all/reward/total", "test reward (greedy)"),
    ("test/env/all/correct", "test accuracy (greedy)"),
)


def plot_reward_curve(
    metrics_path: str | os.PathLike[str], png_path: str | os.PathLike[str]
) -> Path | None:
    """Draws reward (and test reward/accuracy, when logged) against step into a PNG
    (`shell.plots.plot_step_curves`).

    Returns:
        The PNG path, or None when `metrics_path` holds no reward values.
    """
    records = read_jsonl(metrics_path)
    # Train reward drawn last (on top): test points sit on train's line when both are 1.0.
    curves = [
        metric_curve(records, key, label=label, zorder=zorder)
        for zorder, (key, label) in zip((3, 2, 2), _CURVES, strict=True)
    ]
    drawn = [curve for curve in curves if curve.steps]
    if not drawn:
        return None
    panel = Panel(title="rlpure: reward per step", curves=drawn, ylabel="reward")
    return plot_step_curves([panel], Path(png_path))
