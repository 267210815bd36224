"""`rlpure cost LOG_DIR` and `rlpure report LOG_DIR`: what a run's log dir says, as text and PNGs.

Conventions:
- Both read a log dir as the loop writes it (and as tinker-cookbook 0.6.1's `rl.train` writes
  it): `metrics.jsonl` (one row per step with `step`, the `tokens/<kind>` counts,
  `env/<tag>/reward/total`, eval keys `test/...`; a last row with `final_eval`),
  `timing_spans.jsonl` (one `{"step": i, "spans": [{"name", "duration", "wall_start",
  "wall_end"}]}` object per step, wall times in seconds from the step's first span) and
  `config.json` (`base_model`, or the cookbook's `model_name`; `price_table`).
- A training row is a row without `final_eval` that is not the final totals row (the
  cookbook's `tokens/cumulative/*`, `tokens/discarded/*` and `cost/*_usd` at `step=end_batch`);
  a step logged twice counts once (its last row).
- `rlpure cost` prices the steps' token counts (`rlpure.cost.summarize_cost`) with `--prices
  FILE`, else the run's own `price_table`, else prints token counts only. Tokens counted
  outside any step (sampling of groups dropped for a constant reward) are the difference
  between the last `tokens/cumulative/<kind>` logged (the totals row's, when there is one) and
  the steps' sum; they are shown apart and included in the total.
- `rlpure report` draws with `shell.plots`: `report_curves.png` (the train reward of every env
  tag, and every eval curve: `.../reward/total` and `.../correct` keys outside `env/`) and
  `report_timing_NNNNNN.png` (one step's spans as a Gantt), in the log dir or `--out DIR`;
  their paths are printed, one a line.
- Errors are `ConfigError` lines naming the log dir or file (exit code 2): a missing dir, no
  `metrics.jsonl`, no training rows, no token counts, a `--step` without spans.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from rlpure.cost import CostSummary, TokenCostRates, summarize_cost
from rlpure.usage import TOKEN_KINDS, TokenUsage
from shell.commands import Command
from shell.cost import load_price_table
from shell.errors import ConfigError
from shell.plots import Panel, metric_curve, plot_span_gantt, plot_step_curves
from shell.timing import TIMING_SPANS_FILE
from shell.training import METRICS_FILE, read_jsonl

__all__ = [
    "COST_COMMAND",
    "CURVES_FILE",
    "REPORT_COMMAND",
    "cost_main",
    "cost_text",
    "curve_panels",
    "is_totals_row",
    "read_step_spans",
    "report_main",
    "run_cost",
    "training_rows",
]

CURVES_FILE = "report_curves.png"
"""`rlpure report`'s reward and eval curves."""
_CONFIG_FILE = "config.json"


# --- reading a log dir -------------------------------------------------------------------------


def _log_dir(path: str | Path) -> Path:
    log_dir = Path(path)
    if not log_dir.is_dir():
        what = "is not a directory" if log_dir.exists() else "no such directory"
        raise ConfigError(f"log dir {log_dir}: {what}")
    if not (log_dir / METRICS_FILE).is_file():
        raise ConfigError(f"log dir {log_dir}: no {METRICS_FILE} (not a training run's log dir?)")
    return log_dir


_TOTALS_PREFIXES = ("tokens/cumulative/", "tokens/discarded/")
_TOTALS_KEYS = frozenset({"step", "final_totals", "cost/cumulative_usd", "cost/discarded_usd"})


def is_totals_row(row: Mapping[str, Any]) -> bool:
    """Whether `row` is the final totals row: the cookbook's `CostTracker.cumulative_metrics()`
    logged at `step=end_batch` (only running totals, no step's own values), which rlpure's loop
    writes too, marked `final_totals`.

    Examples:
        >>> is_totals_row({"step": 3, "tokens/cumulative/sampled": 9, "cost/cumulative_usd": 1})
        True
        >>> is_totals_row({"step": 2, "tokens/sampled": 3, "tokens/cumulative/sampled": 9})
        False
    """
    return all(k in _TOTALS_KEYS or k.startswith(_TOTALS_PREFIXES) for k in row)


def training_rows(log_dir: str | Path) -> list[dict[str, Any]]:
    """The training rows of `log_dir/metrics.jsonl` in step order (a step's last row wins):
    rows without `final_eval` that are not the final totals row (`is_totals_row`).

    Raises:
        ConfigError: no such log dir, no metrics.jsonl, or no training row in it.
        LogFileError: a damaged metrics.jsonl (naming the line).
    """
    root = _log_dir(log_dir)
    by_step: dict[int, dict[str, Any]] = {}
    for row in read_jsonl(root / METRICS_FILE):
        if "final_eval" in row or is_totals_row(row):
            continue
        if isinstance(row.get("step"), int):
            by_step[row["step"]] = row
    if not by_step:
        raise ConfigError(f"{root / METRICS_FILE}: no training steps logged yet")
    return [by_step[step] for step in sorted(by_step)]


def _last_training_row_per_step(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` without the training rows a later row of the same step replaces (a step logged
    twice counts once, its last row, as `training_rows` reads it), in step order (stable; a
    row without an integer step last), so that a curve never runs back.

    Examples:
        >>> rows = [{"step": 1, "r": 0.2}, {"step": 2, "r": 0.3}, {"step": 1, "r": 0.9}]
        >>> [row["r"] for row in _last_training_row_per_step(rows)]
        [0.9, 0.3]
    """

    def training(row: dict[str, Any]) -> bool:
        return (
            "final_eval" not in row and not is_totals_row(row) and isinstance(row.get("step"), int)
        )

    last = {row["step"]: i for i, row in enumerate(rows) if training(row)}
    kept = [row for i, row in enumerate(rows) if not training(row) or last[row["step"]] == i]
    return sorted(
        kept, key=lambda row: row["step"] if isinstance(row.get("step"), int) else math.inf
    )


def _recorded_config(log_dir: Path) -> dict[str, Any]:
    path = log_dir / _CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: unreadable ({err})") from None
    return data if isinstance(data, dict) else {}


# --- rlpure cost -------------------------------------------------------------------------------


def _usage(row: Mapping[str, Any], prefix: str, *, where: str) -> TokenUsage | None:
    keys = [f"{prefix}/{kind}" for kind in TOKEN_KINDS]
    if not any(key in row for key in keys):
        return None
    try:
        return TokenUsage.from_mapping(
            {kind: row.get(f"{prefix}/{kind}", 0) for kind in TOKEN_KINDS}, where=where
        )
    except ValueError as err:
        raise ConfigError(str(err)) from None


def run_cost(
    log_dir: str | Path,
    *,
    prices: str | Path | None = None,
    model: str | None = None,
) -> tuple[CostSummary, dict[str, Any]]:
    """The cost summary of a run, and what it was computed from.

    Args:
        log_dir: the run's log dir.
        prices: a price table (`shell.cost`); default the run's own `price_table`, if any.
        model: the model to price; default the run's `base_model` (or `model_name`).

    Returns:
        `(summary, info)`: `info` has `log_dir`, `model`, `prices` (the table used, or None),
        `outside_steps` (a `TokenUsage` counted in the totals but in no step) and `recorded_usd`
        (the last row's `cost/cumulative_usd`, or None).

    Raises:
        ConfigError: see `training_rows`; rows without token counts; a bad table; no model to
            price (no `--model` and no `config.json`) or a model the table does not list.
    """
    rows = training_rows(log_dir)
    root = Path(log_dir)
    where = str(root / METRICS_FILE)
    steps = []
    for row in rows:
        usage = _usage(row, "tokens", where=f"{where} step {row['step']}")
        if usage is None:
            raise ConfigError(
                f"{where}: step {row['step']} has no token counts (tokens/sampled, ...): the "
                "log dir was written before token accounting, so there is nothing to price"
            )
        steps.append(usage)
    total = TokenUsage()
    for usage in steps:
        total += usage
    # the running totals after the run: the last row holding them (the final totals row when
    # there is one, which also counts sampling after the last step)
    with_totals = [
        row for row in read_jsonl(root / METRICS_FILE) if "tokens/cumulative/sampled" in row
    ]
    last = with_totals[-1] if with_totals else rows[-1]
    cumulative = _usage(last, "tokens/cumulative", where=f"{where} step {last.get('step')}")
    outside = TokenUsage(
        **{
            kind: max(0, count - total.as_dict()[kind])
            for kind, count in (cumulative or total).as_dict().items()
        }
    )
    recorded = _recorded_config(root)
    table_path = prices if prices is not None else recorded.get("price_table")
    rates: TokenCostRates | None = None
    name = model or recorded.get("base_model") or recorded.get("model_name")
    if table_path is not None:
        option = "--prices" if prices is not None else f"{root / _CONFIG_FILE} price_table"
        table = load_price_table(table_path, option=option)
        if not isinstance(name, str):
            raise ConfigError(
                f"log dir {root}: no {_CONFIG_FILE} naming the model; pass --model NAME"
            )
        try:
            rates = table.rates_for(name)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    recorded_usd = last.get("cost/cumulative_usd")
    info = {
        "log_dir": root,
        "model": name if isinstance(name, str) else None,
        "prices": None if table_path is None else Path(table_path),
        "outside_steps": outside,
        "recorded_usd": recorded_usd if isinstance(recorded_usd, (int, float)) else None,
    }
    return summarize_cost(steps, rates, extra=outside), info


def _usd(value: float | None) -> str:
    return "-" if value is None else f"{value:,.6f}"


def cost_text(summary: CostSummary, info: Mapping[str, Any]) -> str:
    """The table `rlpure cost` prints."""
    n = summary.num_steps
    head = f"{info['log_dir']}: {n} step{'s' * (n != 1)}"
    if info.get("model"):
        head += f", model {info['model']}"
    head += (
        f", prices from {info['prices']} (USD per million tokens)"
        if info.get("prices")
        else " (no price table: token counts only; pass --prices FILE for USD)"
    )
    lines = [head, f"{'kind':<18}{'tokens':>16}{'USD':>16}"]
    for kind in summary.kinds:
        lines.append(f"{kind.kind:<18}{kind.tokens:>16,}{_usd(kind.usd):>16}")
    lines.append(f"{'total':<18}{summary.total_tokens:>16,}{_usd(summary.total_usd):>16}")
    per_step = f"{summary.tokens_per_step:,.1f}"
    lines.append(f"{'per step (mean)':<18}{per_step:>16}{_usd(summary.usd_per_step):>16}")
    outside: TokenUsage = info["outside_steps"]
    outside_total = sum(outside.as_dict().values())
    if outside_total:
        lines.append(
            f"(the total includes {outside_total:,} tokens counted in no step: the sampling of "
            "groups dropped before training)"
        )
    if summary.total_usd is None and info.get("recorded_usd") is not None:
        lines.append(f"recorded cost/cumulative_usd: {_usd(info['recorded_usd'])}")
    return "\n".join(lines)


def add_cost_arguments(parser: argparse.ArgumentParser) -> None:
    """`rlpure cost`'s flags."""
    parser.add_argument("log_dir", metavar="LOG_DIR", help="A training run's log dir.")
    parser.add_argument(
        "--prices",
        metavar="FILE",
        help="Price table (TOML/JSON, USD per million tokens by model: prefill, "
        "cached_prefill, sample, train; or Tinker's models.json). Default: the run's "
        "price_table, else token counts only.",
    )
    parser.add_argument(
        "--model", metavar="NAME", help="Model to price (default: the run's base_model)."
    )


def cost_main(args: argparse.Namespace, *, out: TextIO | None = None) -> int:
    """`rlpure cost LOG_DIR [--prices FILE] [--model NAME]`."""
    summary, info = run_cost(args.log_dir, prices=args.prices, model=args.model)
    print(cost_text(summary, info), file=out or sys.stdout)
    return 0


COST_COMMAND = Command(
    "cost",
    help="Token counts and USD of a run (from metrics.jsonl), per token kind and per step.",
    run=cost_main,
    add_arguments=add_cost_arguments,
)
"""`rlpure cost`."""


# --- rlpure report -----------------------------------------------------------------------------


def _is_eval_key(key: str) -> bool:
    return not key.startswith("env/") and (
        key.endswith("/reward/total") or key.endswith("/correct")
    )


def curve_panels(all_rows: Sequence[Mapping[str, Any]]) -> list[Panel]:
    """The panels of `report_curves.png`: the train reward of every env tag
    (`env/<tag>/reward/total`, training rows only), then, when there are any, every eval curve.

    Raises:
        ConfigError: the rows hold no reward and no eval value.
    """
    train = [r for r in all_rows if "final_eval" not in r]
    keys = sorted({k for r in all_rows for k in r})
    train_curves = [
        metric_curve(train, k) for k in keys if k.startswith("env/") and k.endswith("/reward/total")
    ]
    eval_curves = [metric_curve(all_rows, k) for k in keys if _is_eval_key(k)]
    panels = [
        Panel(title=title, curves=[c for c in curves if c.steps])
        for title, curves in (
            ("train reward (mean total per trajectory)", train_curves),
            ("evaluations", eval_curves),
        )
    ]
    panels = [panel for panel in panels if panel.curves]
    if not panels:
        raise ConfigError(
            "metrics.jsonl: no reward (env/<tag>/reward/total) or eval (.../reward/total, "
            ".../correct) values to draw"
        )
    return panels


def read_step_spans(
    log_dir: str | Path, step: int | None, *, trained_steps: Sequence[int] = ()
) -> tuple[int, list[dict[str, Any]]]:
    """`(step, spans)` of one step of `timing_spans.jsonl`.

    `step` None picks the last of `trained_steps` that has spans (the last line is often the
    final evaluation's, at step `num_steps`, with no training in it), else the last line's.

    Raises:
        ConfigError: no such file, no line for `step` (naming the steps it has), or a span
            without the cookbook's keys.
    """
    path = Path(log_dir) / TIMING_SPANS_FILE
    if not path.is_file():
        raise ConfigError(f"log dir {log_dir}: no {TIMING_SPANS_FILE} (no timing spans recorded)")
    by_step = {}
    for record in read_jsonl(path):
        if isinstance(record.get("step"), int) and isinstance(record.get("spans"), list):
            by_step[record["step"]] = record["spans"]
    if not by_step:
        raise ConfigError(f"{path}: no step's spans in it")
    if step is not None:
        chosen = step
    else:
        trained = [s for s in trained_steps if s in by_step]
        chosen = max(trained) if trained else max(by_step)
    if chosen not in by_step:
        have = sorted(by_step)
        raise ConfigError(
            f"{path}: no spans for step {chosen} (steps {have[0]}..{have[-1]}; {len(have)} "
            "recorded)"
        )
    spans = by_step[chosen]
    if not spans:
        raise ConfigError(f"{path}: step {chosen} has no spans")
    for i, span in enumerate(spans):
        missing = [k for k in ("name", "wall_start", "wall_end") if k not in span]
        if missing:
            raise ConfigError(f"{path}: step {chosen} span {i}: missing {missing}")
        for key in ("wall_start", "wall_end"):
            value = span[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(
                    f"{path}: step {chosen} span {i}: {key} is not a number ({value!r})"
                )
    return chosen, spans


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """`rlpure report`'s flags."""
    parser.add_argument("log_dir", metavar="LOG_DIR", help="A training run's log dir.")
    parser.add_argument(
        "--step",
        type=int,
        metavar="N",
        help="Step whose timing Gantt to draw (default: the last trained step in "
        "timing_spans.jsonl).",
    )
    parser.add_argument(
        "--out", metavar="DIR", help="Where to write the PNGs (default: the log dir)."
    )


def report_main(args: argparse.Namespace, *, out: TextIO | None = None) -> int:
    """`rlpure report LOG_DIR [--step N] [--out DIR]`: writes the PNGs, prints their paths.

    Without `timing_spans.jsonl` (a log dir of an older rlpure) only the curves are drawn and
    a note goes to stderr, unless `--step` asked for a Gantt.
    """
    stream = out or sys.stdout
    log_dir = _log_dir(args.log_dir)
    trained_steps = [int(row["step"]) for row in training_rows(log_dir)]
    target = Path(args.out) if args.out else log_dir
    if target.exists() and not target.is_dir():
        raise ConfigError(f"--out {target}: exists and is not a directory")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"--out {target}: cannot create it: {err.strerror}") from None
    timing = None  # read first: a bad --step is refused before any file is written
    if args.step is not None or (log_dir / TIMING_SPANS_FILE).is_file():
        timing = read_step_spans(log_dir, args.step, trained_steps=trained_steps)
    panels = curve_panels(_last_training_row_per_step(read_jsonl(log_dir / METRICS_FILE)))
    written = [plot_step_curves(panels, target / CURVES_FILE)]
    if timing is not None:
        step, spans = timing
        written.append(plot_span_gantt(step, spans, target / f"report_timing_{step:06d}.png"))
    else:
        print(
            f"rlpure report: {log_dir} has no {TIMING_SPANS_FILE}; no timing chart drawn",
            file=sys.stderr,
        )
    for path in written:
        print(path, file=stream)
    return 0


REPORT_COMMAND = Command(
    "report",
    help="Draw a run's reward/eval curves and one step's timing Gantt to PNG.",
    run=report_main,
    add_arguments=add_report_arguments,
)
"""`rlpure report`."""
