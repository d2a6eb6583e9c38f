"""Batch-1 int4 GEMV (engine.layers.quant.triton_int4, the tuned table's kernel and tile) against the bf16 GEMV of
the same shape (cuBLAS and the engine's Triton GEMV), as bytes read / time: int4 bytes are the packed weight, the
fp16 group scales and the uint8 zeros. Random GPTQ weights (group 128, no act-order), x bf16, weights rotated so
the L2 never holds the one being read, timed as CUDA-graph replays (engine.tuning.timing). Also 4 and 8 rows
(small decode batches), int4 only.

python3 -m bench.kernels.gemv_int4 --out $OUT     (writes bench_gemv_int4.json; GPU only)
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.layers.quant.int4_layout import PackedInt4, dequantize
from engine.layers.quant.triton_int4 import int4_linear
from engine.layers.triton_gemv import linear
from engine.tuning.int4_weights import SHAPES, packed_nbytes, packed_weight
from engine.tuning.limits import measure_limits
from engine.tuning.timing import time_graph_us


def _int4_call(xs: torch.Tensor, weights: list[PackedInt4], i: int) -> torch.Tensor:
    return int4_linear(xs, weights[i], None)


def bench_shape(n: int, k: int) -> dict[str, float]:
    packed = packed_weight(n, k)
    weights = [
        PackedInt4(packed.weight.clone(), packed.scale.clone(), packed.zero.clone(), None)
        for _ in range(max(2, (400 << 20) // packed_nbytes(packed)))
    ]
    dense_weight = dequantize(packed).to(torch.bfloat16)
    dense = [dense_weight.clone() for _ in range(max(2, (400 << 20) // (n * k * 2)))]
    row: dict[str, float] = {"n": n, "k": k}
    for rows in (1, 4, 8):
        xs = torch.randn(rows, k, dtype=torch.bfloat16, device="cuda")
        reference = xs.double() @ dequantize(weights[0]).double().T
        error = float((int4_linear(xs, weights[0], None).double() - reference).norm() / reference.norm())
        int4_us = time_graph_us(functools.partial(_int4_call, xs, weights), len(weights), 20)
        row |= {
            f"int4_m{rows}_us": int4_us,
            f"int4_m{rows}_gb_s": packed_nbytes(weights[0]) / int4_us / 1e3,
            f"int4_m{rows}_rel_err": error,
        }
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    dense_bytes = n * k * 2
    for name, fn in (("bf16_cublas", lambda w: F.linear(x, w)), ("bf16_triton", lambda w: linear(x, w, None))):
        us = time_graph_us(lambda i: fn(dense[i]), len(dense), 20)  # noqa: B023 - called at once
        row |= {f"{name}_us": us, f"{name}_gb_s": dense_bytes / us / 1e3}
    row["int4_speedup_vs_bf16_triton"] = row["bf16_triton_us"] / row["int4_m1_us"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    limits = measure_limits(torch.bfloat16)
    rows = {name: bench_shape(n, k) for name, (n, k) in SHAPES.items()}
    for name, row in rows.items():
        print(
            f"{name}: int4 m1 {row['int4_m1_us']:.1f} us {row['int4_m1_gb_s']:.0f} GB/s "
            f"(m4 {row['int4_m4_gb_s']:.0f}, m8 {row['int4_m8_gb_s']:.0f}); "
            f"bf16 triton {row['bf16_triton_us']:.1f} us {row['bf16_triton_gb_s']:.0f} GB/s, "
            f"cublas {row['bf16_cublas_gb_s']:.0f} GB/s; x{row['int4_speedup_vs_bf16_triton']:.2f}; "
            f"rel err {row['int4_m1_rel_err']:.1e}",
            flush=True,
        )
    result = {"device": limits.device_name, "copy_gb_s": limits.copy_bandwidth_gb_s, "shapes": rows}
    print(f"copy bandwidth {limits.copy_bandwidth_gb_s:.0f} GB/s ({limits.device_name})")
    (args.out / "bench_gemv_int4.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
