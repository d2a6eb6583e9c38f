"""Timelines drawn as plain SVG (no plotting library): one column per run, a stack of panels per column, one step line
per series (each value holds until the next sample). A NaN value (a window with nothing measured) leaves a gap.

`render(runs, panels, note)` takes each run's rows (column name -> number, with `t_s`, the sample's time) and returns
the whole SVG. Used by scripts/plot_autoscale.py (docs/deploy-autoscale.svg) and by W12 (bench/online/split_output.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape

PANEL_W, PANEL_H, MARGIN_L, MARGIN_T, GAP = 400, 150, 50, 40, 45
Row = Mapping[str, float]


@dataclass(frozen=True, slots=True)
class Series:
    """One line of a panel: the row column it draws, its legend and colour; `dashed` for a reference (an SLO)."""

    column: str
    label: str
    colour: str
    dashed: bool = False


@dataclass(frozen=True, slots=True)
class Panel:
    title: str
    series: tuple[Series, ...]


def _steps(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """A step line through `points`: each value holds until the next sample."""
    stepped: list[tuple[float, float]] = []
    for (x, y), (next_x, _) in zip(points, [*points[1:], points[-1]], strict=True):
        stepped += [(x, y), (next_x, y)]
    return stepped


def _segments(points: list[tuple[float, float]]) -> list[list[tuple[float, float]]]:
    """The step line of `points` cut where a value is NaN: the steps of each run of defined values, each holding
    until the next sample (defined or not)."""
    segments: list[list[tuple[float, float]]] = []
    current: list[tuple[float, float]] = []
    for index, (x, y) in enumerate(points):
        if math.isnan(y):
            if current:
                segments.append([*_steps(current)[:-1], (x, current[-1][1])])
                current = []
            continue
        current.append((x, y))
        if index == len(points) - 1:
            segments.append(_steps(current))
    return segments


def _ticks(top: float) -> list[float]:
    """About five round ticks from 0 to `top` (steps 0.5, then 1, 2, 5 times a power of ten)."""
    steps = (0.5, *(m * 10**e for e in range(12) for m in (1, 2, 5)))
    step = next(s for s in steps if top / s <= 6)
    return [i * step for i in range(int(top / step) + 1)]


def panel(rows: Sequence[Row], title: str, series: Sequence[Series], x0: int, y0: int) -> str:
    """One panel's SVG: axes, ticks, a step line per series and its legend, at (x0, y0)."""
    t_max = max(r["t_s"] for r in rows) or 1.0
    values = [r[s.column] for r in rows for s in series if not math.isnan(r[s.column])]
    y_max = max(1.0, *values)
    y_top = y_max * 1.15

    def xy(t: float, v: float) -> str:
        return f"{x0 + t / t_max * PANEL_W:.1f},{y0 + PANEL_H - v / y_top * PANEL_H:.1f}"

    parts = [
        f'<rect x="{x0}" y="{y0}" width="{PANEL_W}" height="{PANEL_H}" fill="none" stroke="#444"/>',
        f'<text x="{x0}" y="{y0 - 6}" font-size="12" font-weight="bold">{escape(title)}</text>',
    ]
    for tick in _ticks(y_max):
        parts.append(
            f'<text x="{x0 - 6}" y="{y0 + PANEL_H - tick / y_top * PANEL_H + 4:.1f}" font-size="10" '
            f'text-anchor="end">{tick:g}</text>'
        )
    for tick in _ticks(t_max):
        x = x0 + tick / t_max * PANEL_W
        parts.append(f'<text x="{x:.1f}" y="{y0 + PANEL_H + 13}" font-size="10" text-anchor="middle">{tick:g}</text>')
    for index, line in enumerate(series):
        dash = ' stroke-dasharray="5 3"' if line.dashed else ""
        for segment in _segments([(r["t_s"], r[line.column]) for r in rows]):
            points = " ".join(xy(t, v) for t, v in segment)
            parts.append(f'<polyline points="{points}" fill="none" stroke="{line.colour}" stroke-width="2"{dash}/>')
        parts.append(
            f'<text x="{x0 + PANEL_W - 4}" y="{y0 + 14 + 13 * index}" font-size="11" text-anchor="end" '
            f'fill="{line.colour}">{escape(line.label)}</text>'
        )
    return "\n".join(parts)


def render(runs: Mapping[str, Sequence[Row]], panels: Sequence[Panel], note: str, x_label: str) -> str:
    """The whole SVG: one column per run (its name on top), `x_label` and `note` at the bottom."""
    column_w = MARGIN_L + PANEL_W + 20
    height = MARGIN_T + len(panels) * (PANEL_H + GAP) + 20
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{column_w * len(runs)}" height="{height}" '
        f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>'
    ]
    for index, (name, rows) in enumerate(runs.items()):
        x0 = index * column_w + MARGIN_L
        parts.append(f'<text x="{x0}" y="16" font-size="14" font-weight="bold">{escape(name)}</text>')
        for row_index, spec in enumerate(panels):
            parts.append(panel(rows, spec.title, spec.series, x0, MARGIN_T + row_index * (PANEL_H + GAP)))
    parts.append(f'<text x="{MARGIN_L}" y="{height - 6}" font-size="10">{escape(x_label)}. {escape(note)}</text></svg>')
    return "\n".join(parts) + "\n"
