"""Batch-1 FP8 GEMV (`engine.layers.triton_fp8_linear`) per Qwen3-8B projection shape: the default tiles and a
sweep of others, as weight bytes / time against the copy bandwidth, beside the bf16 Triton GEMV on the same shape.

python3 bench/kernel_fp8_gemv.py --out $OUT     (writes bench_fp8_gemv.json; GPU only)
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
from pathlib import Path
from typing import Any

import torch

from bench.kernel_gemv import time_rotating_us
from bench.limits import measure_limits
from engine.layers.quant.fp8 import quantize_fp8_rows
from engine.layers.triton_fp8_linear import Fp8GemvTiles, default_tiles, fp8_gemv
from engine.layers.triton_gemv import linear

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
SWEEP = [Fp8GemvTiles(n, k, w) for n, k, w in itertools.product((4, 8, 16), (512, 1024, 2048), (4, 8))]


def _run(x: torch.Tensor, tiles: Fp8GemvTiles | None, weight: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return fp8_gemv(x, weight[0], weight[1], None, tiles)


def bench_shape(n: int, k: int, copy_gb_s: float) -> dict[str, Any]:
    copies = max(2, (400 << 20) // (n * k))
    weights = [quantize_fp8_rows(torch.randn(n, k, device="cuda") * k**-0.5) for _ in range(copies)]
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    row: dict[str, Any] = {"n": n, "k": k, "default": str(default_tiles(n, k))}
    gigabytes = n * k / 1e9
    bf16 = [w.to(torch.bfloat16) * s[:, None].to(torch.bfloat16) for w, s in weights[: max(2, copies // 2)]]
    bf16_us = time_rotating_us(lambda w: linear(x, w, None), bf16)
    row |= {"bf16_triton_us": bf16_us, "bf16_pct_of_copy": 100 * 2 * gigabytes / bf16_us * 1e6 / copy_gb_s}
    del bf16
    timings: dict[str, float] = {}
    errors: dict[str, str] = {}
    for tiles in [None, *SWEEP]:
        if tiles is not None and (n % tiles.block_n or k % tiles.block_k):
            continue
        name = "default" if tiles is None else str(tiles)
        try:
            timings[name] = round(time_rotating_us(functools.partial(_run, x, tiles), weights), 2)
        except Exception as error:  # a tile shape that does not fit is recorded; the sweep goes on
            errors[name] = f"{type(error).__name__}: {str(error)[:120]}"
    best = min(timings, key=timings.__getitem__)
    row |= {"fp8_us": timings["default"], "fp8_pct_of_copy": 100 * gigabytes / timings["default"] * 1e6 / copy_gb_s}
    row |= {"best": best, "best_us": timings[best], "sweep_us": timings, "sweep_errors": errors}
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    limits = measure_limits(torch.bfloat16)
    rows = {}
    for name, (n, k) in SHAPES.items():
        rows[name] = bench_shape(n, k, limits.copy_bandwidth_gb_s)
        print(name, json.dumps({key: v for key, v in rows[name].items() if not key.startswith("sweep")}), flush=True)
    result = {"device": limits.device_name, "copy_gb_s": limits.copy_bandwidth_gb_s, "shapes": rows}
    (args.out / "bench_fp8_gemv.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
