"""The GPU scripts' summary lines (bench.reporting.gpu_summary) from a folder of step outputs written here."""

from __future__ import annotations

import json
from pathlib import Path

from bench.reporting.gpu_summary import int4_nbytes, section_lines


def _write(folder: Path, name: str, data: object) -> None:
    (folder / name).write_text(json.dumps(data))


def test_gemv_table_per_projection_from_both_sweeps(tmp_path: Path) -> None:
    fp8_row = {
        "n": 4096,
        "k": 4096,
        "bf16_triton_us": 14.0,
        "bf16_pct_of_copy": 80.0,
        "best_us": 8.0,
        "best_pct_of_copy": 70.0,
        "best_tiles": "tiles(4, 256)",
    }
    _write(tmp_path, "bench_fp8_gemv.json", {"copy_gb_s": 3000.0, "shapes": {"o": fp8_row}})
    us = int4_nbytes(4096, 4096) / (0.75 * 3000.0 * 1e3)  # 75% of copy
    entries = {"4096x4096x1": {"kernel": "gemv", "meta": {"HALF2": 1}}}
    _write(
        tmp_path, "int4_tuned.json", {"copy_gb_s": 3000.0, "timings": {"4096x4096x1": {"us": us}}, "entries": entries}
    )
    lines = section_lines(tmp_path, "gemv")
    assert int4_nbytes(4096, 4096) == 4096 * 2048 + 3 * 4096 * 32
    assert lines[2] == (
        f"o 4096x4096: bf16 80% (14.0 us); fp8 70% (8.0 us, tiles(4, 256)); int4 75% ({us:.1f} us, gemv {{'HALF2': 1}})"
    )
    assert lines[1] == "qkv 6144x4096: bf16 / fp8: no result int4: no result"


def test_workload_lines_name_the_floor_and_the_target(tmp_path: Path) -> None:
    limits = {"decode_floor_ms": 1.64, "tpot_over_floor": 1.25}
    _write(tmp_path, "w1_gptq.json", {"engine": {"tpot_ms_p50": 2.05}, "limits": limits})
    _write(tmp_path, "w1_none.json", {"engine": {"tpot_ms_p50": 6.0}, "limits": limits})
    assert section_lines(tmp_path, "w1=none,gptq,fp8") == [
        "w1 none: tpot_ms_p50 6.000 ms; floor 1.640 ms, TPOT/floor 1.25 (baseline)",
        "w1 gptq: tpot_ms_p50 2.050 ms; floor 1.640 ms, TPOT/floor 1.25 (target <= 2.2: met)",
        "w1 fp8: no result (see w1_fp8.log)",
    ]


def test_test_lines_keep_verdicts_and_assertions(tmp_path: Path) -> None:
    log = ["PASSED tests/a.py::test_x", "noise", "E   AssertionError: relative error 2e-2", "===== 1 failed, 1 passed"]
    (tmp_path / "gpu_tests.log").write_text("\n".join(log))
    assert section_lines(tmp_path, "tests=gpu_tests")[1:] == ["  " + log[0], "  " + log[3], "  " + log[2]]
