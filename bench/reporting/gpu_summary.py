"""Summary lines of the GPU scripts (scripts/gpu/*.sh), read from the logs and JSON their steps leave in one folder.

python3 -m bench.reporting.gpu_summary LOGS SECTION...

Sections (printed in the order given):
- `tests=NAME`: the verdict lines, printed figures and first assertion lines of the pytest log NAME.log;
- `w1=METHODS`, `w2=METHODS` (comma-separated: none, fp8, gptq, fp8_head = fp8 with the lm_head in fp8): batch-1
  TPOT p50 (W1) or 2048-token TTFT p50 (W2) of `w1_<method>.json` / `w2_<method>.json`, with the decode floor and
  the issue's target;
- `gemv`: the batch-1 GEMV per Qwen3-8B projection as % of copy bandwidth: bf16 and fp8 from the fp8 sweep
  (bench_fp8_gemv.json), GPTQ int4 (bytes of the packed weight, its scales and zeros) from the int4 sweep's table
  (int4_tuned.json), each with its time and the winning tile;
- `fp8_gemv`: the fp8 sweep per projection (old table vs tuned tile, its fastest tiles, the 2048-row prefill path).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

TARGETS_MS = {("w1", "fp8"): 3.2, ("w1", "fp8_head"): 3.2, ("w1", "gptq"): 2.2, ("w2", "fp8"): 35.0}
FIGURES = {"w1": "tpot_ms_p50", "w2": "ttft_ms_p50"}
PROJECTIONS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
GROUP_SIZE = 128


def load(folder: Path, name: str) -> Any:
    """The JSON file `name` in `folder`, or None where it is missing or unreadable."""
    try:
        return json.loads((folder / name).read_text())
    except (OSError, ValueError):
        return None


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def test_lines(folder: Path, log_name: str) -> list[str]:
    try:
        log = (folder / f"{log_name}.log").read_text().splitlines()
    except OSError:
        return [f"tests {log_name}: no log"]
    lines = [f"-- {log_name}: verdicts, printed figures, first assertion lines"]
    pattern = r"(PASSED|FAILED|ERROR) |.*greedy agreement|=+ .*(passed|failed|error)"
    lines += ["  " + line[:300] for line in log if re.match(pattern, line)]
    errors = [line for line in log if line.startswith("E ") and re.search(r"Error|assert|differ", line)]
    return lines + ["  " + line[:300] for line in errors[:16]]


def workload_lines(folder: Path, workload: str, methods: list[str]) -> list[str]:
    lines = []
    for method in methods:
        result = load(folder, f"{workload}_{method}.json")
        if result is None:
            lines.append(f"{workload} {method}: no result (see {workload}_{method}.log)")
            continue
        figure, limits = result["engine"][FIGURES[workload]], result.get("limits", {})
        line = f"{workload} {method}: {FIGURES[workload]} {figure:.3f} ms"
        if "decode_floor_ms" in limits:
            line += f"; floor {limits['decode_floor_ms']:.3f} ms, TPOT/floor {limits['tpot_over_floor']:.2f}"
        target = TARGETS_MS.get((workload, method))
        line += " (baseline)" if method == "none" else ""
        lines.append(line + ("" if target is None else f" (target <= {target}: {verdict(figure <= target)})"))
    return lines


def int4_nbytes(n: int, k: int) -> int:
    """The packed int4 weight, its fp16 scales and uint8 zeros (group 128)."""
    return n * k // 2 + 3 * n * (k // GROUP_SIZE)


def gemv_lines(folder: Path) -> list[str]:
    fp8, int4 = load(folder, "bench_fp8_gemv.json"), load(folder, "int4_tuned.json")
    lines = ["batch-1 GEMV, % of copy bandwidth (us; the winning tile)"]
    for name, (n, k) in PROJECTIONS.items():
        cells = [f"{name} {n}x{k}:"]
        row = (fp8 or {}).get("shapes", {}).get(name)
        if row is None:
            cells.append("bf16 / fp8: no result")
        else:
            cells.append(f"bf16 {row['bf16_pct_of_copy']:.0f}% ({row['bf16_triton_us']:.1f} us);")
            cells.append(f"fp8 {row['best_pct_of_copy']:.0f}% ({row['best_us']:.1f} us, {row['best_tiles']});")
        key = f"{n}x{k}x1"
        timing, entry = (int4 or {}).get("timings", {}).get(key), (int4 or {}).get("entries", {}).get(key)
        if timing is None or entry is None:
            cells.append("int4: no result")
        else:
            pct = 100 * int4_nbytes(n, k) / timing["us"] / 1e3 / int4["copy_gb_s"]
            cells.append(f"int4 {pct:.0f}% ({timing['us']:.1f} us, {entry['kernel']} {entry['meta']})")
        lines.append(" ".join(cells))
    return lines


def fp8_gemv_lines(folder: Path) -> list[str]:
    lines = []
    for name, row in (load(folder, "bench_fp8_gemv.json") or {}).get("shapes", {}).items():
        lines.append(
            f"fp8 gemv {name} {row['n']}x{row['k']}: old table {row['fp8_us']:.1f} us = {row['fp8_pct_of_copy']:.0f}%"
            f" of copy; tuned {row['best_tiles']} {row['best_us']:.1f} us = {row['best_pct_of_copy']:.0f}% (>= 85%: "
            f"{verdict(row['best_pct_of_copy'] >= 85)}; bf16 GEMV {row['bf16_pct_of_copy']:.0f}%)"
        )
        top = sorted(row["sweep_us"].items(), key=lambda kv: kv[1])[:4]
        lines.append("   fastest: " + "; ".join(f"{us:.1f} {tiles}" for tiles, us in top))
        if row.get("sweep_errors"):
            lines.append(f"   dropped or failed: {len(row['sweep_errors'])} tiles")
        pre = row.get("prefill")
        if pre:
            lines.append(
                f"   prefill 2048 rows: quantize {pre['quantize_us']:.1f} us, fp8 linear {pre['fp8_linear_us']:.1f} us "
                f"({pre['fp8_tflop_s']:.0f} TFLOP/s), bf16 {pre['bf16_us']:.1f} us ({pre['bf16_tflop_s']:.0f} TFLOP/s)"
            )
    return lines


def section_lines(folder: Path, section: str) -> list[str]:
    name, _, arg = section.partition("=")
    if name == "tests":
        return test_lines(folder, arg)
    if name in FIGURES:
        return workload_lines(folder, name, arg.split(","))
    if name == "gemv":
        return gemv_lines(folder)
    if name == "fp8_gemv":
        return fp8_gemv_lines(folder)
    raise SystemExit(f"section {section!r}: not one of tests=NAME, w1=METHODS, w2=METHODS, gemv, fp8_gemv")


def main(argv: list[str]) -> None:
    folder = Path(argv[0])
    for section in argv[1:]:
        print("\n".join(section_lines(folder, section)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
