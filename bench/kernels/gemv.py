"""Batch-1 GEMV (decode at batch 1 reads every weight once): cuBLAS (F.linear) vs the engine's Triton GEMV
(`engine.layers.triton_gemv`), per Qwen3-8B projection shape, bf16, as weight bytes / time.

python3 -m bench.kernels.gemv --out $OUT     (writes bench_gemv.json; GPU only)
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import torch
import torch.nn.functional as F
import triton

from engine.layers.triton_gemv import linear
from engine.tuning.limits import measure_limits

Weight = TypeVar("Weight")
SHAPES = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (24576, 4096),
    "down": (4096, 12288),
    "lm_head": (151936, 4096),
}


def time_rotating_us(fn: Callable[[Weight], object], weights: Sequence[Weight]) -> float:
    """Median us of fn(weight), cycling through `weights` so the L2 never holds the one being read."""
    position = [0]

    def call() -> None:
        position[0] = (position[0] + 1) % len(weights)
        fn(weights[position[0]])

    return float(triton.testing.do_bench(call, warmup=25, rep=50, return_mode="median")) * 1e3


def bench_shape(n: int, k: int) -> dict[str, float]:
    copies = max(2, (400 << 20) // (n * k * 2))
    weights = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") for _ in range(copies)]
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    reference = F.linear(x.double(), weights[0].double())
    error = float((linear(x, weights[0], None).double() - reference).norm() / reference.norm())
    cublas_us = time_rotating_us(lambda w: F.linear(x, w), weights)
    triton_us = time_rotating_us(lambda w: linear(x, w, None), weights)
    gigabytes = n * k * 2 / 1e9
    return {
        "n": n,
        "k": k,
        "cublas_us": cublas_us,
        "cublas_tb_s": gigabytes / cublas_us * 1e3,
        "triton_us": triton_us,
        "triton_tb_s": gigabytes / triton_us * 1e3,
        "rel_err": error,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    limits = measure_limits(torch.bfloat16)
    rows = {name: bench_shape(n, k) for name, (n, k) in SHAPES.items()}
    for name, row in rows.items():
        print(name, json.dumps(row), flush=True)
    result = {"device": limits.device_name, "copy_gb_s": limits.copy_bandwidth_gb_s, "shapes": rows}
    (args.out / "bench_gemv.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
