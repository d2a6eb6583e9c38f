"""Draw autoscaling timelines as an SVG, one column per run (bench/reporting/timeline_svg.py draws).

- `--panels deploy` (default): the autoscale e2e timeline (tests/e2e/test_autoscale.py with AUTOSCALE_TIMELINE_CSV):
  the pods per role over time on top, the load the planner sees below.
- `--panels w12`: W12's timeline.csv files (`pdserve bench --workload w12`, one per run, e.g. the autoscaler's and a
  fixed split's): pods and GPUs, TTFT and TPOT p90 against their SLOs, requests finished and failed per window.

    AUTOSCALE_TIMELINE_CSV=/tmp/timeline.csv pytest tests/e2e/test_autoscale.py -k heavy
    python scripts/plot_autoscale.py /tmp/timeline.csv docs/deploy-autoscale.svg --note "$(date -u +%F)"
    python scripts/plot_autoscale.py --panels w12 auto/timeline.csv fixed/timeline.csv docs/autoscale-split.svg
"""

from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from bench.online.split_output import SPLIT_PANELS, SPLIT_X_LABEL
from bench.reporting import timeline_svg
from bench.reporting.timeline_svg import Panel, Series

DEPLOY_PANELS = (
    Panel(
        "pods (active)",
        (
            Series("prefill_pods", "prefill", "#1f77b4"),
            Series("decode_pods", "decode", "#d62728"),
            Series("draining_pods", "draining", "#7f7f7f"),
        ),
    ),
    Panel(
        "load",
        (
            Series("prefill_waiting", "prefill waiting requests", "#1f77b4"),
            Series("decode_requests", "decode running + waiting", "#d62728"),
        ),
    ),
)
PANELS = {"deploy": (DEPLOY_PANELS, "seconds since the autoscaler started"), "w12": (SPLIT_PANELS, SPLIT_X_LABEL)}


def read_runs(*paths: Path) -> dict[str, list[dict[str, float]]]:
    """The CSVs' rows by run (the `run` column), numbers as floats (an empty cell: NaN), in file order."""
    runs: dict[str, list[dict[str, float]]] = defaultdict(list)
    for path in paths:
        with path.open(newline="") as source:
            for row in csv.DictReader(source):
                runs[row.pop("run")].append({name: float(value) if value else math.nan for name, value in row.items()})
    return dict(runs)


def render(
    runs: dict[str, list[dict[str, float]]], note: str, panels: Sequence[Panel] = DEPLOY_PANELS, x_label: str = ""
) -> str:
    """The SVG of `runs` (deploy panels unless told)."""
    return timeline_svg.render(runs, panels, note, x_label or PANELS["deploy"][1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", type=Path, nargs="+", help="the timelines (deploy: AUTOSCALE_TIMELINE_CSV)")
    parser.add_argument("svg", type=Path, help="where to write the plot")
    parser.add_argument("--panels", choices=list(PANELS), default="deploy", help="what the CSVs hold (default: deploy)")
    parser.add_argument("--note", default="", help="a line under the plot (e.g. the command and the date)")
    args = parser.parse_args()
    panels, x_label = PANELS[args.panels]
    args.svg.write_text(render(read_runs(*args.csv), args.note, panels, x_label))


if __name__ == "__main__":
    main()
