"""FP8 linear kernels (`engine.layers.triton_fp8_linear`) per Qwen3-8B projection shape.

- Batch 1: the FP8 GEMV with its default tiles and a sweep of others, as weight bytes / time against the copy
  bandwidth, beside the bf16 Triton GEMV on the same shape.
- Prefill (2048 rows): the activation quantizer, `torch._scaled_mm` and the bf16 `F.linear`, as TFLOP/s.
All timed as CUDA-graph replays (as the engine's decode steps run), so launch overhead does not count: each graph
holds one call per weight copy, the copies rotating past the L2.

python3 bench/kernel_fp8_gemv.py --out $OUT     (writes bench_fp8_gemv.json; GPU only)
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
import triton

from bench.limits import measure_limits
from engine.layers.quant.fp8 import quantize_fp8_rows
from engine.layers.triton_fp8_linear import Fp8GemvTiles, default_tiles, fp8_gemv, fp8_linear, quantize_rows
from engine.layers.triton_gemv import linear

W = TypeVar("W")

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
# NOTE: block_k 2048 never won on H100 (run 1); the unrolled K loop and a single stage are what is new to learn.
SWEEP = [
    *(Fp8GemvTiles(n, k, w, unroll=u) for n, k, w, u in itertools.product((8, 16), (512, 1024), (4, 8), (1, 2, 4))),
    *(Fp8GemvTiles(4, 1024, 4, unroll=u) for u in (1, 2, 4)),
    Fp8GemvTiles(16, 512, 8, num_stages=1),
    Fp8GemvTiles(8, 1024, 4, num_stages=1),
]
PREFILL_ROWS = 2048


def time_graph_us(fn: Callable[[W], object], weights: Sequence[W]) -> float:
    """Median us per fn(weight) call, replaying one CUDA graph of a call per weight (compiled beforehand)."""
    for weight in weights:
        fn(weight)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for weight in weights:
            fn(weight)
    return float(triton.testing.do_bench(graph.replay, warmup=25, rep=50, return_mode="median")) * 1e3 / len(weights)


def _run(x: torch.Tensor, tiles: Fp8GemvTiles | None, weight: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return fp8_gemv(x, weight[0], weight[1], None, tiles)


def bench_shape(n: int, k: int, copy_gb_s: float) -> dict[str, Any]:
    copies = max(2, (400 << 20) // (n * k))
    weights = [quantize_fp8_rows(torch.randn(n, k, device="cuda") * k**-0.5) for _ in range(copies)]
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    row: dict[str, Any] = {"n": n, "k": k, "default": str(default_tiles(n, k))}
    gigabytes = n * k / 1e9
    bf16 = [w.to(torch.bfloat16) * s[:, None].to(torch.bfloat16) for w, s in weights[: max(2, copies // 2)]]
    bf16_us = time_graph_us(lambda w: linear(x, w, None), bf16)
    row |= {"bf16_triton_us": bf16_us, "bf16_pct_of_copy": 100 * 2 * gigabytes / bf16_us * 1e6 / copy_gb_s}
    del bf16
    timings: dict[str, float] = {}
    errors: dict[str, str] = {}
    for tiles in [None, *SWEEP]:
        if tiles is not None and (n % tiles.block_n or k % tiles.block_k):
            continue
        name = "default" if tiles is None else str(tiles)
        try:
            timings[name] = round(time_graph_us(functools.partial(_run, x, tiles), weights), 2)
        except Exception as error:  # a tile shape that does not fit is recorded; the sweep goes on
            errors[name] = f"{type(error).__name__}: {str(error)[:120]}"
    best = min(timings, key=timings.__getitem__)
    row |= {"fp8_us": timings["default"], "fp8_pct_of_copy": 100 * gigabytes / timings["default"] * 1e6 / copy_gb_s}
    row |= {"best": best, "best_us": timings[best], "sweep_us": timings, "sweep_errors": errors}
    return row


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
    return {"quantize_us": quantize_us, "fp8_linear_us": fp8_us, "fp8_tflop_s": tflop / fp8_us * 1e6,
            "bf16_us": bf16_us, "bf16_tflop_s": tflop / bf16_us * 1e6}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    limits = measure_limits(torch.bfloat16)
    rows: dict[str, Any] = {}
    result = {"device": limits.device_name, "copy_gb_s": limits.copy_bandwidth_gb_s, "shapes": rows}
    for name, (n, k) in SHAPES.items():
        rows[name] = bench_shape(n, k, limits.copy_bandwidth_gb_s)
        rows[name]["prefill"] = bench_prefill(n, k)
        print(name, json.dumps({key: v for key, v in rows[name].items() if not key.startswith("sweep")}), flush=True)
        # NOTE: rewritten after every shape, so a run cut short keeps the shapes it finished.
        (args.out / "bench_fp8_gemv.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
