"""Draw W10's controlled-acceptance curve (`pdserve bench --workload w10 --json FILE`) as an SVG: the effective TPOT
ratio (speculation on / off, p50 TPOT) against the replayed acceptance, one line per batch size and k, with the
bounds of issue 13 drawn (batch 1, k=4: at most 0.35 at acceptance 1.0, at most 1.05 at 0.0). A point is filled
where the timed round's tokens were its recording (`same_tokens`), hollow where not (its acceptance is then not
the one asked for). Plain SVG, no plotting library.

    python -m bench --workload w10 --model-shape qwen3-8b --dtype bfloat16 --json w10.json
    python scripts/plot_spec_curve.py w10.json docs/spec-curve.svg --note "H100, $(date -u +%F)"
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

PLOT_W, PLOT_H, MARGIN_L, MARGIN_T, MARGIN_B, LEGEND_W = 400, 260, 55, 50, 55, 170
TITLE = "W10: speculation at controlled acceptance"
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
BOUNDS = ((0.35, "0.35: acceptance 1.0, batch 1"), (1.05, "1.05: acceptance 0.0, batch 1"))
"""Issue 13's limits on the TPOT ratio: the value and its label."""
Point = tuple[float, float, bool]
"""(acceptance, TPOT ratio, same_tokens)."""


def curves_of(result: dict[str, Any], batch_sizes: list[int]) -> dict[str, list[Point]]:
    """W10's rows of the given batch sizes as one curve per batch size and k ("batch 1, k=4"), by acceptance
    ascending, in the order of `batch_sizes` and then of k."""
    curves: dict[tuple[int, int], list[Point]] = defaultdict(list)
    for row in result["rows"]:
        if row["batch"] in batch_sizes:
            curves[row["batch"], row["k"]].append((row["acceptance"], row["tpot_ratio"], row["same_tokens"]))
    ordered = sorted(curves, key=lambda key: (batch_sizes.index(key[0]), key[1]))
    return {f"batch {batch}, k={k}": sorted(curves[batch, k]) for batch, k in ordered}


def _ticks(top: float) -> list[float]:
    """About five round ticks from 0 to `top`."""
    step = next(s for s in (0.1, 0.2, 0.25, 0.5, 1, 2, 5, 10) if top / s <= 6)
    return [round(i * step, 6) for i in range(int(top / step + 1e-9) + 1)]


def _axes(y_top: float) -> list[str]:
    """The frame, both axes' ticks and labels, and the bounds as dashed lines."""

    def y(v: float) -> float:
        return MARGIN_T + PLOT_H - v / y_top * PLOT_H

    parts = [f'<rect x="{MARGIN_L}" y="{MARGIN_T}" width="{PLOT_W}" height="{PLOT_H}" fill="none" stroke="#444"/>']
    for tick in _ticks(y_top):
        parts.append(f'<text x="{MARGIN_L - 6}" y="{y(tick) + 4:.1f}" font-size="10" text-anchor="end">{tick:g}</text>')
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        x = MARGIN_L + tick * PLOT_W
        parts.append(
            f'<text x="{x:.1f}" y="{MARGIN_T + PLOT_H + 14}" font-size="10" text-anchor="middle">{tick:g}</text>'
        )
    for value, label in BOUNDS:
        parts.append(
            f'<line x1="{MARGIN_L}" y1="{y(value):.1f}" x2="{MARGIN_L + PLOT_W}" y2="{y(value):.1f}" '
            f'stroke="#777" stroke-dasharray="5,4"/>'
        )
        parts.append(
            f'<text x="{MARGIN_L + 4}" y="{y(value) - 4:.1f}" font-size="10" fill="#555">{escape(label)}</text>'
        )
    parts.append(
        f'<text x="{MARGIN_L + PLOT_W / 2}" y="{MARGIN_T + PLOT_H + 32}" font-size="11" '
        f'text-anchor="middle">replayed acceptance (proposed tokens left uncorrupted)</text>'
    )
    parts.append(
        f'<text x="14" y="{MARGIN_T + PLOT_H / 2}" font-size="11" text-anchor="middle" '
        f'transform="rotate(-90 14 {MARGIN_T + PLOT_H / 2})">TPOT on / off</text>'
    )
    return parts


def _curve(points: list[Point], label: str, colour: str, index: int, y_top: float) -> list[str]:
    """One curve: its line, a marker per point (hollow where not same_tokens) and its legend entry."""
    xy = [(MARGIN_L + a * PLOT_W, MARGIN_T + PLOT_H - r / y_top * PLOT_H, same) for a, r, same in points]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in xy)
    parts = [f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"/>']
    for x, y, same in xy:
        fill = colour if same else "white"
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{fill}" stroke="{colour}"/>')
    legend_y = MARGIN_T + 12 + 16 * index
    parts.append(
        f'<text x="{MARGIN_L + PLOT_W + 12}" y="{legend_y}" font-size="11" fill="{colour}">{escape(label)}</text>'
    )
    return parts


def render(curves: dict[str, list[Point]], subtitle: str, note: str) -> str:
    """The whole SVG: a title and `subtitle` on top, the axes and bounds, one curve per entry, `note` at the
    bottom."""
    y_top = max(1.2, *(r for points in curves.values() for _, r, _ in points)) * 1.1
    width, height = MARGIN_L + PLOT_W + LEGEND_W, MARGIN_T + PLOT_H + MARGIN_B
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{MARGIN_L}" y="18" font-size="13" font-weight="bold">{TITLE}</text>',
        f'<text x="{MARGIN_L}" y="34" font-size="11">{escape(subtitle)}</text>',
        *_axes(y_top),
    ]
    for index, (label, points) in enumerate(curves.items()):
        parts += _curve(points, label, COLOURS[index % len(COLOURS)], index, y_top)
    parts.append(f'<text x="{MARGIN_L}" y="{height - 6}" font-size="10">{escape(note)}</text></svg>')
    return "\n".join(parts) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", type=Path, help="pdserve bench --workload w10 --json FILE (controlled acceptance)")
    parser.add_argument("svg", type=Path, help="where to write the plot")
    parser.add_argument("--batch-sizes", default="1,16", help="comma-separated batch sizes to draw (default 1,16)")
    parser.add_argument("--note", default="", help="a line under the plot (e.g. the device, command and date)")
    args = parser.parse_args()
    result = json.loads(args.json.read_text())
    subtitle = (
        f"{result.get('device_name', result['device'])}, {result['model']}, {result['dtype']}, {result['workload']}"
    )
    curves = curves_of(result, [int(b) for b in args.batch_sizes.split(",")])
    args.svg.write_text(render(curves, subtitle, args.note))


if __name__ == "__main__":
    main()
