"""scripts/plot_autoscale.py: the timeline CSV read by run, step lines at exact coordinates, one column per run."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

from tests.deploy.helpers import ROOT

CSV = """run,t_s,prefill_pods,decode_pods,draining_pods,prefill_waiting,decode_requests
prefill-heavy,0.00,1,1,0,0,0
prefill-heavy,5.00,2,1,0,6,2
prefill-heavy,10.00,1,1,1,0,0
decode-heavy,0.00,1,1,0,0,3
"""


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("plot_autoscale", ROOT / "scripts" / "plot_autoscale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_runs_are_read_in_file_order(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text(CSV)
    runs = load_script().read_runs(tmp_path / "t.csv")
    assert list(runs) == ["prefill-heavy", "decode-heavy"]
    assert [row["prefill_pods"] for row in runs["prefill-heavy"]] == [1.0, 2.0, 1.0]
    assert runs["decode-heavy"] == [
        {
            "t_s": 0.0,
            "prefill_pods": 1.0,
            "decode_pods": 1.0,
            "draining_pods": 0.0,
            "prefill_waiting": 0.0,
            "decode_requests": 3.0,
        }
    ]


def test_the_pods_panel_draws_step_lines(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text(CSV)
    script = load_script()
    svg = script.render(script.read_runs(tmp_path / "t.csv"), "make compose-e2e, 2026-11-24")
    assert svg.startswith('<svg xmlns="http://www.w3.org/2000/svg" width="940" height="450"')
    lines = re.findall(r'<polyline points="([^"]+)" fill="none" stroke="(#[0-9a-f]+)"', svg)
    assert len(lines) == 2 * 5
    # prefill pods of the first run: y_max 2 (top 2.3) over 150 px at y 40..190; t 0..10 s over 400 px from x 50.
    assert lines[0] == ("50.0,124.8 250.0,124.8 250.0,59.6 450.0,59.6 450.0,124.8 450.0,124.8", "#1f77b4")
    assert "make compose-e2e, 2026-11-24" in svg and svg.endswith("</svg>\n")
