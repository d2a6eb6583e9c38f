"""FP8 linear kernels (`engine.layers.triton_fp8_linear`) per Qwen3-8B projection shape.

- Batch 1: the FP8 GEMV with its default tiles and a sweep of others, as weight bytes / time against the copy
  bandwidth, beside the bf16 Triton GEMV on the same shape: the tuner's sweep (engine.layers.tune_fp8_gemv, whose
  docstring tells its rounds). `--write-table` writes each shape's fastest tiles into
  engine/layers/fp8_gemv_tiles.json (the table the kernel reads) as the tuner does, a copy to --out.
- Prefill (2048 rows): the activation quantizer, `torch._scaled_mm` and the bf16 `F.linear`, as TFLOP/s.
All timed as CUDA-graph replays (as the engine's decode steps run), so launch overhead does not count: each graph
holds one call per weight copy, the copies rotating past the L2.

python3 -m bench.kernels.fp8_gemv --out $OUT [--write-table] [--shapes NAME...]   (writes bench_fp8_gemv.json; GPU only)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from engine.layers.quant.fp8 import quantize_fp8_rows
from engine.layers.triton_fp8_linear import fp8_linear, quantize_rows
from engine.layers.tune_fp8_gemv import PROJECTIONS, SHAPES, bench_shape, time_graph_us, write_table
from engine.tuning.limits import measure_limits

PREFILL_ROWS = 2048


def bench_prefill(n: int, k: int) -> dict[str, float]:
    """One 2048-row chunk through the shape: quantizer alone, the whole fp8 linear, and bf16 F.linear."""
    copies = max(2, (400 << 20) // (n * k))
    weights = [quantize_fp8_rows(torch.randn(n, k, device="cuda") * k**-0.5) for _ in range(copies)]
    x = torch.randn(PREFILL_ROWS, k, dtype=torch.bfloat16, device="cuda")
    quantize_us = time_graph_us(lambda _: quantize_rows(x), weights)
    fp8_us = time_graph_us(lambda w: fp8_linear(x, w[0], w[1], None), weights)
    bf16 = [w.to(torch.bfloat16) * s[:, None].to(torch.bfloat16) for w, s in weights[: max(2, copies // 2)]]
    bf16_us = time_graph_us(lambda w: F.linear(x, w), bf16)
    tflop = 2 * PREFILL_ROWS * n * k / 1e12
    return {
        "quantize_us": quantize_us,
        "fp8_linear_us": fp8_us,
        "fp8_tflop_s": tflop / fp8_us * 1e6,
        "bf16_us": bf16_us,
        "bf16_tflop_s": tflop / bf16_us * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--write-table", action="store_true", help="write the fastest tiles into the kernel's table")
    parser.add_argument(
        "--shapes", nargs="+", choices=SHAPES, default=PROJECTIONS, help="default: the decoder's projections"
    )
    args = parser.parse_args()
    limits = measure_limits(torch.bfloat16)
    rows: dict[str, Any] = {}
    result = {"device": limits.device_name, "copy_gb_s": limits.copy_bandwidth_gb_s, "shapes": rows}
    for name in args.shapes:
        n, k = SHAPES[name]
        rows[name] = bench_shape(n, k, limits.copy_bandwidth_gb_s)
        rows[name]["prefill"] = bench_prefill(n, k)
        shown = {key: v for key, v in rows[name].items() if not key.startswith("sweep")}
        print(name, json.dumps(shown, default=str), flush=True)
        # NOTE: rewritten after every shape, so a run cut short keeps the shapes it finished.
        (args.out / "bench_fp8_gemv.json").write_text(json.dumps(result, indent=1, default=str))
        if args.write_table:
            write_table(rows.values(), args.out)


if __name__ == "__main__":
    main()
