"""W12's files in --out-dir: `timeline.csv` (one row per window, a `run` column first: the run's name), `w12.json`
(the figures and the timeline) and `timeline.svg` (bench/reporting/timeline_svg.py; scripts/plot_autoscale.py
--panels w12 draws several runs' CSVs side by side). A NaN figure (a window where no request ended) is an empty CSV
cell and a JSON null."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from bench.reporting.timeline_svg import Panel, Series, render

SPLIT_PANELS = (
    Panel(
        "pods and GPUs",
        (
            Series("prefill_pods", "prefill (active)", "#1f77b4"),
            Series("decode_pods", "decode (active)", "#d62728"),
            Series("draining_pods", "draining", "#7f7f7f"),
            Series("starting_pods", "starting", "#2ca02c"),
            Series("gpus_used", "GPUs used", "#000000", dashed=True),
        ),
    ),
    Panel(
        "TTFT p90 (ms) of the requests ended in each window",
        (Series("ttft_ms_p90", "TTFT p90", "#1f77b4"), Series("slo_ttft_ms", "SLO", "#7f7f7f", dashed=True)),
    ),
    Panel(
        "TPOT p90 (ms)",
        (Series("tpot_ms_p90", "TPOT p90", "#d62728"), Series("slo_tpot_ms", "SLO", "#7f7f7f", dashed=True)),
    ),
    Panel(
        "requests ended per window",
        (Series("finished", "ended", "#2ca02c"), Series("failed", "failed", "#d62728")),
    ),
)
SPLIT_X_LABEL = "seconds since the steady load started"


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float as None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def _cell(value: Any) -> Any:
    """A CSV cell: NaN empty, other floats to 3 decimals."""
    if not isinstance(value, float):
        return value
    return "" if math.isnan(value) else round(value, 3)


def write_outputs(out_dir: Path, run_name: str, result: dict[str, Any], note: str) -> dict[str, str]:
    """Write the three files of `result` (its `timeline` rows: the CSV and the plot; all of it: the JSON; the folder
    is created); their paths by kind (csv, json, svg)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out_dir / "timeline.csv", "json": out_dir / "w12.json", "svg": out_dir / "timeline.svg"}
    rows: list[dict[str, Any]] = result["timeline"]
    with paths["csv"].open("w", newline="") as out:
        writer = csv.writer(out)
        columns = list(rows[0]) if rows else []
        writer.writerow(["run", *columns])
        writer.writerows([run_name, *(_cell(row[c]) for c in columns)] for row in rows)
    paths["json"].write_text(json.dumps(json_safe(result), indent=2) + "\n")
    numeric = [{k: float(v) for k, v in row.items()} for row in rows]
    paths["svg"].write_text(render({run_name: numeric}, SPLIT_PANELS, note, SPLIT_X_LABEL) if rows else "")
    return {kind: str(path) for kind, path in paths.items()}
