"""A run's PNG charts: metric curves against the step, and one step's phase Gantt.

Conventions:
- matplotlib's object API on an Agg canvas (`Figure` + `FigureCanvasAgg`): no `pyplot`, no
  global backend switch, so it draws headless and from any thread.
- One style for every chart: `DPI` dots per inch, `WIDTH` inches wide, steps on x with
  whole-number ticks, a light grid, a small legend; a curve of fewer than `MARKER_LIMIT`
  points marks each point.
- A curve's points are the rows holding a finite number (not a bool) under its key; rows are
  `metrics.jsonl` objects with an integer `step`.
- Each `plot_*` writes one PNG (creating its folder) and returns its path;
  `write_span_gantt_html` an HTML page holding one.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "DPI",
    "MARKER_LIMIT",
    "WIDTH",
    "Curve",
    "Panel",
    "metric_curve",
    "plot_span_gantt",
    "plot_step_curves",
    "write_span_gantt_html",
]

DPI = 110
"""Dots per inch of every chart."""
WIDTH = 8.0
"""Width of a curve chart, in inches (a Gantt is wider: its bars carry labels)."""
MARKER_LIMIT = 40
"""A curve with fewer points than this marks each point."""
_PANEL_HEIGHT = 3.6
_GANTT_WIDTH = 10.0


class Curve(NamedTuple):
    """One line of a curve chart: `values[i]` at step `steps[i]`."""

    label: str
    steps: Sequence[int]
    values: Sequence[float]
    zorder: float = 2.0
    """Drawing order: a higher one is drawn on top (matplotlib's default for lines is 2)."""


class Panel(NamedTuple):
    """One axes of a curve chart: its title, its curves and an optional y label."""

    title: str
    curves: Sequence[Curve]
    ylabel: str | None = None


def _is_number(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def metric_curve(
    rows: Sequence[Mapping[str, Any]], key: str, *, label: str | None = None, zorder: float = 2.0
) -> Curve:
    """The curve of `key` over `rows` (see the module docstring; no points: empty sequences).

    Examples:
        >>> metric_curve([{"step": 0, "r": 1}, {"step": 1}, {"step": 2, "r": 0.5}], "r")
        Curve(label='r', steps=[0, 2], values=[1.0, 0.5], zorder=2.0)
    """
    points = [
        (int(row["step"]), float(row[key]))
        for row in rows
        if isinstance(row.get("step"), int) and _is_number(row.get(key))
    ]
    return Curve(
        label=key if label is None else label,
        steps=[step for step, _ in points],
        values=[value for _, value in points],
        zorder=zorder,
    )


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, png_path: str | Path) -> Path:
    fig.tight_layout()
    out = Path(png_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    return out


def plot_step_curves(panels: Sequence[Panel], png_path: str | Path) -> Path:
    """Draws `panels` one above the other into a PNG, steps on x.

    Args:
        panels: the axes, top first; each needs at least one curve.
        png_path: the file to write.

    Raises:
        ValueError: no panel, or a panel without curves.
    """
    from matplotlib.ticker import MaxNLocator

    if not panels or not all(panel.curves for panel in panels):
        raise ValueError("plot_step_curves: every chart needs a panel and every panel a curve")
    fig = _figure(WIDTH, _PANEL_HEIGHT * len(panels))
    for i, panel in enumerate(panels):
        ax = fig.add_subplot(len(panels), 1, i + 1)
        for curve in panel.curves:
            marker = "o" if len(curve.steps) < MARKER_LIMIT else None
            ax.plot(
                curve.steps, curve.values, marker=marker, label=curve.label, zorder=curve.zorder
            )
        ax.set_title(panel.title)
        ax.set_xlabel("step")
        if panel.ylabel is not None:
            ax.set_ylabel(panel.ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    return _save(fig, png_path)


def plot_span_gantt(step: int, spans: Sequence[Mapping[str, Any]], png_path: str | Path) -> Path:
    """Draws one step's spans as a Gantt chart into a PNG.

    A row per span name in order of first start (first on top), a bar per span from
    `wall_start` to `wall_end` (seconds from the step's first span), labelled with its duration
    when wide enough to hold it.

    Args:
        step: the step, named in the title.
        spans: the step's spans, each with `name`, `wall_start` and `wall_end` (at least one).
        png_path: the file to write.
    """
    return _save(_span_gantt(step, spans), png_path)


def write_span_gantt_html(
    step: int, spans: Sequence[Mapping[str, Any]], html_path: str | Path
) -> Path:
    """Writes `plot_span_gantt`'s chart as a self-contained HTML page (the PNG inline), the
    cookbook's `timing_gantt.html`; creates its folder. Same arguments, `html_path` the page."""
    buffer = io.BytesIO()
    fig = _span_gantt(step, spans)
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    image = base64.b64encode(buffer.getvalue()).decode("ascii")
    out = Path(html_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Iteration {step} — Span "
        f"Timeline</title></head><body><img alt='spans of iteration {step}' "
        f"src='data:image/png;base64,{image}'></body></html>\n",
        encoding="utf-8",
    )
    return out


def _span_gantt(step: int, spans: Sequence[Mapping[str, Any]]) -> Figure:
    ordered = sorted(spans, key=lambda s: (float(s["wall_start"]), -float(s["wall_end"])))
    rows: dict[str, list[tuple[float, float]]] = {}  # name -> (left, width), first start first
    start = min(float(s["wall_start"]) for s in ordered)
    end = max(float(s["wall_end"]) for s in ordered)
    for span in ordered:
        left = float(span["wall_start"]) - start
        width = max(float(span["wall_end"]) - float(span["wall_start"]), 0.0)
        rows.setdefault(str(span["name"]), []).append((left, width))
    names = list(rows)
    fig = _figure(_GANTT_WIDTH, 1.2 + 0.38 * len(names))
    ax = fig.add_subplot()
    for row, name in enumerate(names):  # one artist per row: thousands of spans draw fast
        bars = rows[name]
        colour = f"C{row % 10}"
        ax.broken_barh(bars, (row - 0.3, 0.6), facecolors=colour, edgecolor="black", linewidth=0.4)
        for left, width in bars:
            if width >= 0.04 * max(end - start, 1e-9):  # at most 25 labels a row
                ax.text(
                    left + width / 2,
                    row,
                    f"{width:.3g}s",
                    ha="center",
                    va="center",
                    fontsize="x-small",
                )
    ax.set_yticks(range(len(names)), labels=names, fontsize="small")
    ax.invert_yaxis()  # first phase on top
    ax.set_xlabel("seconds from the step's first span")
    ax.set_title(f"step {step}: phase timing ({end - start:.3g} s, {len(ordered)} spans)")
    ax.grid(axis="x", alpha=0.3)
    return fig
