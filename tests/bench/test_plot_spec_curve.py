"""scripts/plot_spec_curve.py: W10's rows as one curve per batch size and k, at exact coordinates, with the bounds."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _row(batch: int, acceptance: float, ratio: float, same_tokens: bool = True) -> dict[str, object]:
    return {"batch": batch, "k": 4, "acceptance": acceptance, "tpot_ratio": ratio, "same_tokens": same_tokens}


RESULT = {
    "workload": "w10 spec 128/128",
    "model": "shape:qwen3-8b",
    "dtype": "bfloat16",
    "device": "cuda:0",
    "device_name": "NVIDIA H100 80GB HBM3",
    "rows": [
        _row(1, 1.0, 0.25),
        _row(1, 0.0, 1.0),
        _row(1, 0.5, 0.6),
        _row(16, 1.0, 0.5, same_tokens=False),
        _row(16, 0.0, 0.99),
        _row(64, 1.0, 1.0),
    ],
}


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("plot_spec_curve", ROOT / "scripts" / "plot_spec_curve.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_curves_by_batch_size_and_k_in_acceptance_order() -> None:
    curves = load_script().curves_of(RESULT, [16, 1])
    assert curves == {
        "batch 16, k=4": [(0.0, 0.99, True), (1.0, 0.5, False)],
        "batch 1, k=4": [(0.0, 1.0, True), (0.5, 0.6, True), (1.0, 0.25, True)],
    }


def test_the_svg_draws_the_curves_and_the_bounds(tmp_path: Path) -> None:
    (tmp_path / "w10.json").write_text(json.dumps(RESULT))
    command = [sys.executable, str(ROOT / "scripts" / "plot_spec_curve.py"), str(tmp_path / "w10.json")]
    subprocess.run([*command, str(tmp_path / "w10.svg"), "--note", "H100, 2026-11-24"], check=True)
    svg = (tmp_path / "w10.svg").read_text()
    assert svg.startswith('<svg xmlns="http://www.w3.org/2000/svg" width="625" height="365"')
    # y: ratio 0..1.32 (1.2 x 1.1) over 260 px at y 50..310; x: acceptance 0..1 over 400 px from x 55.
    lines = re.findall(r'<polyline points="([^"]+)" fill="none" stroke="(#[0-9a-f]+)"', svg)
    assert lines == [("55.0,113.0 255.0,191.8 455.0,260.8", "#1f77b4"), ("55.0,115.0 455.0,211.5", "#d62728")]
    bounds = re.findall(r'<line x1="55" y1="([0-9.]+)" x2="455" y2="\1"', svg)
    assert bounds == ["241.1", "103.2"]
    assert '<circle cx="455.0" cy="211.5" r="3.5" fill="white" stroke="#d62728"/>' in svg
    assert svg.count('fill="white" stroke=') == 1
    assert "NVIDIA H100 80GB HBM3, shape:qwen3-8b, bfloat16, w10 spec 128/128" in svg and "H100, 2026-11-24" in svg
