"""Draw the autoscale e2e timeline (tests/e2e/test_autoscale.py with AUTOSCALE_TIMELINE_CSV) as an SVG: one column
per run, the pods per role over time on top, the load the planner sees below. Plain SVG, no plotting library.

    AUTOSCALE_TIMELINE_CSV=/tmp/timeline.csv pytest tests/e2e/test_autoscale.py -k heavy
    python scripts/plot_autoscale.py /tmp/timeline.csv docs/deploy-autoscale.svg --note "$(date -u +%F)"
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path
from xml.sax.saxutils import escape

PANEL_W, PANEL_H, MARGIN_L, MARGIN_T, GAP = 400, 150, 50, 40, 45
PANELS = (
    (
        "pods (active)",
        (
            ("prefill_pods", "prefill", "#1f77b4"),
            ("decode_pods", "decode", "#d62728"),
            ("draining_pods", "draining", "#7f7f7f"),
        ),
    ),
    (
        "load",
        (
            ("prefill_waiting", "prefill waiting requests", "#1f77b4"),
            ("decode_requests", "decode running + waiting", "#d62728"),
        ),
    ),
)
"""Each panel: its title and its series (CSV column, legend, colour)."""


def read_runs(path: Path) -> dict[str, list[dict[str, float]]]:
    """The CSV's rows by run, numbers as floats, in file order."""
    runs: dict[str, list[dict[str, float]]] = defaultdict(list)
    with path.open(newline="") as source:
        for row in csv.DictReader(source):
            runs[row.pop("run")].append({name: float(value) for name, value in row.items()})
    return dict(runs)


def _steps(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """A step line through `points`: each value holds until the next sample."""
    stepped: list[tuple[float, float]] = []
    for (x, y), (next_x, _) in zip(points, [*points[1:], points[-1]], strict=True):
        stepped += [(x, y), (next_x, y)]
    return stepped


def panel(rows: list[dict[str, float]], title: str, series: tuple[tuple[str, str, str], ...], x0: int, y0: int) -> str:
    """One panel's SVG: axes, ticks, a step line per series and its legend, at (x0, y0)."""
    t_max = max(r["t_s"] for r in rows) or 1.0
    y_max = max(1.0, *(r[column] for r in rows for column, _, _ in series))
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
    for index, (column, label, colour) in enumerate(series):
        points = " ".join(xy(t, v) for t, v in _steps([(r["t_s"], r[column]) for r in rows]))
        parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
        parts.append(
            f'<text x="{x0 + PANEL_W - 4}" y="{y0 + 14 + 13 * index}" font-size="11" text-anchor="end" '
            f'fill="{colour}">{escape(label)}</text>'
        )
    return "\n".join(parts)


def _ticks(top: float) -> list[float]:
    """About five round ticks from 0 to `top`."""
    step = next(s for s in (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if top / s <= 6)
    return [i * step for i in range(int(top / step) + 1)]


def render(runs: dict[str, list[dict[str, float]]], note: str) -> str:
    """The whole SVG: one column per run (its name on top), `note` and the time axis label at the bottom."""
    column_w = MARGIN_L + PANEL_W + 20
    height = MARGIN_T + len(PANELS) * (PANEL_H + GAP) + 20
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{column_w * len(runs)}" height="{height}" '
        f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>'
    ]
    for index, (name, rows) in enumerate(runs.items()):
        x0 = index * column_w + MARGIN_L
        parts.append(f'<text x="{x0}" y="16" font-size="14" font-weight="bold">{escape(name)}</text>')
        for row_index, (title, series) in enumerate(PANELS):
            parts.append(panel(rows, title, series, x0, MARGIN_T + row_index * (PANEL_H + GAP)))
    parts.append(
        f'<text x="{MARGIN_L}" y="{height - 6}" font-size="10">seconds since the autoscaler started. '
        f"{escape(note)}</text></svg>"
    )
    return "\n".join(parts) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", type=Path, help="the timeline (AUTOSCALE_TIMELINE_CSV)")
    parser.add_argument("svg", type=Path, help="where to write the plot")
    parser.add_argument("--note", default="", help="a line under the plot (e.g. the command and the date)")
    args = parser.parse_args()
    args.svg.write_text(render(read_runs(args.csv), args.note))


if __name__ == "__main__":
    main()
