"""The int4 kernels' sweep (GPU only): for each Qwen3-8B projection shape and row bucket, time every candidate
config (engine.layers.quant.triton_int4: GEMV tiles x split-K x float32 or packed half-precision math (HALF2),
GEMM tiles, dequantize + cuBLAS) as CUDA-graph replays over rotating weights (past the L2), drop any whose output
is off by more than 1e-2 (relative norm against float32; checked before it is timed), and write the fastest per
(N, K, bucket) as the table engine.layers.quant.int4_tuning reads.

python3 -m engine.layers.quant.tune_int4 --out $OUT/int4_tuned.json [--budget-s 140] [--buckets 1,2048]

At 1 row the 3 fastest GEMV configs are timed again with PDL=1 (programmatic dependent launch: the kernel starts
before the previous one in the stream has finished and loads its first weights meanwhile; in the timing graph the
previous kernel is the same GEMV on other weights, which signals its successor at its start, as RMSNorm and
SiLU-mul do before three of a decoder layer's four GEMVs; attention, before o_proj, does not).

Order: 1 row on every shape (W1), 2048 rows (W2), then the other buckets (`--buckets`: only those); entries not
timed (other buckets, or past the budget) keep the committed table's entry, else the heuristic. Buckets 2-16 time
the 12 GEMV tiles that were fastest at 1 row (none when bucket 1 is not swept); every bucket the GEMM tiles of
its size. Prints one line per entry: the winner, its time, int4 GB/s (weight bytes once) or TFLOP/s, and the bf16
baseline at 1 row (Triton GEMV) and 2048 rows (cuBLAS).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.layers.quant.int4_layout import PackedInt4, dequantize
from engine.layers.quant.int4_tuning import ROW_BUCKETS, TABLE_PATH, Int4Config, table_key
from engine.layers.quant.triton_int4 import int4_linear
from engine.layers.triton_gemv import linear
from engine.tuning.int4_weights import SHAPES, packed_nbytes, packed_weight
from engine.tuning.limits import measure_limits
from engine.tuning.timing import time_graph_us

ROTATE_BYTES = 256 << 20
MAX_ERROR = 1e-2
# NOTE: (BLOCK_N, GROUPS, num_warps). 16 words per thread ((16, 8, 4), (32, 4, 4)): the fewest HALF2 instructions
# per weight in the sm90 SASS (2.9 and 3.4, against 3.6-3.9 at 8 words), but with shared-memory layout conversions.
GEMV_TILES = [
    (4, 8, 4),
    (8, 2, 4),
    (8, 4, 4),
    (8, 8, 8),
    (16, 2, 4),
    (16, 4, 4),
    (16, 4, 8),
    (16, 8, 8),
    (32, 2, 4),
    (32, 4, 8),
    (64, 2, 8),
    (16, 8, 4),
    (32, 4, 4),
]
PDL_TRIES = 3
"""At 1 row, the fastest GEMV configs are timed again as programmatic dependent launches (PDL)."""
FLOAT_GEMV_TILES = [(8, 4, 4), (8, 8, 8)]
"""The float32 GEMV's tiles that won every 1-row entry of the H100 sweep before HALF2 (with SPLIT_K 1)."""


def _gemv(bn: int, groups: int, warps: int, split_k: int, half2: int) -> Int4Config:
    meta = {"BLOCK_N": bn, "GROUPS": groups, "SPLIT_K": split_k, "HALF2": half2, "num_warps": warps, "num_stages": 2}
    return Int4Config("gemv", meta)


# NOTE: every tile in packed half precision (HALF2), the float32 GEMV on its former winners only: fewer kernels to
# compile on a fresh device.
GEMV = [_gemv(*tile, s, 1) for tile in GEMV_TILES for s in (1, 2, 4, 8)]
GEMV += [_gemv(*tile, s, 0) for tile in FLOAT_GEMV_TILES for s in (1, 2)]
GEMM_TILES = {
    "small": [(16, 32, 1, 4, 3), (16, 64, 1, 4, 3), (16, 64, 2, 4, 3), (16, 128, 1, 4, 3), (16, 128, 1, 8, 4)],
    "mid": [(32, 64, 1, 4, 3), (64, 64, 1, 4, 3), (64, 128, 1, 4, 3), (64, 64, 2, 4, 3), (64, 128, 1, 8, 4)],
    "large": [
        (128, 128, 1, 8, 3),
        (128, 128, 1, 4, 3),
        (128, 256, 1, 8, 3),
        (64, 128, 1, 4, 4),
        (128, 64, 1, 4, 4),
        (128, 128, 2, 8, 2),
        (64, 256, 1, 8, 3),
    ],
}
DEQUANT = [
    Int4Config("dequant", {"BLOCK_N": bn, "GROUPS": g, "num_warps": 4, "num_stages": 1})
    for bn, g in ((16, 4), (32, 2), (8, 8), (64, 1))
]


def with_pdl(ranked: list[tuple[float, Int4Config]]) -> list[Int4Config]:
    """The GEMV configs of `ranked` as programmatic dependent launches (the kernel's PDL knob)."""
    return [Int4Config("gemv", config.meta | {"PDL": 1}) for _, config in ranked if config.kernel == "gemv"]


def _gemm(bm: int, bn: int, groups: int, warps: int, stages: int) -> Int4Config:
    meta = {"BLOCK_M": bm, "BLOCK_N": bn, "GROUPS": groups, "GROUP_M": 8, "num_warps": warps, "num_stages": stages}
    return Int4Config("gemm", meta)


def candidates(bucket: int, best_gemv: list[Int4Config]) -> list[Int4Config]:
    gemv = (GEMV if bucket == 1 else best_gemv[:12]) if bucket <= 16 else []
    size = "small" if bucket <= 16 else "mid" if bucket <= 64 else "large"
    # NOTE: at 1 row the GEMM (16-row tiles, 15 of them padding) never beat the GEMV in the H100 sweeps.
    gemm = [_gemm(*tile) for tile in GEMM_TILES[size]] if bucket > 1 else []
    return gemv + gemm + (DEQUANT if bucket >= 64 else [])


class ShapeSweep:
    """One weight shape: rotating packed copies, the float32 weight for the error check, bf16 copies."""

    def __init__(self, n: int, k: int) -> None:
        self.n, self.k = n, k
        first = packed_weight(n, k)
        self.nbytes = packed_nbytes(first)
        copies = min(32, max(2, -(-ROTATE_BYTES // self.nbytes)))
        self.weights = [first] + [
            PackedInt4(first.weight.clone(), first.scale.clone(), first.zero.clone(), None) for _ in range(copies - 1)
        ]
        self.reference = dequantize(first)

    def time(self, config: Int4Config, rows: int) -> float | None:
        """us per call, or None where it fails to compile or run, or its output is off."""
        x = torch.randn(rows, self.k, dtype=torch.bfloat16, device="cuda")
        try:
            out = int4_linear(x, self.weights[0], None, config)
            want = x.float() @ self.reference.T
            error = float((out.float() - want).norm() / want.norm())
            if not error < MAX_ERROR:
                print(f"  rejected {config}: relative error {error:.1e}", flush=True)
                return None
            replays = 3 if rows >= 256 else 20
            return time_graph_us(lambda i: int4_linear(x, self.weights[i], None, config), len(self.weights), replays)
        except Exception as error:  # a tile that does not compile or fit is skipped, not fatal
            print(f"  skipped {config}: {type(error).__name__}: {str(error)[:160]}", flush=True)
            return None

    def time_all(self, configs: list[Int4Config], rows: int) -> list[tuple[float, Int4Config]]:
        """(us, config) of those that run and are right, fastest first."""
        return sorted(((us, c) for c in configs if (us := self.time(c, rows))), key=lambda r: r[0])

    def bf16_us(self, rows: int) -> float:
        dense = dequantize(self.weights[0]).to(torch.bfloat16)
        copies = [dense] + [dense.clone() for _ in range(max(1, ROTATE_BYTES // dense.nbytes))]
        x = torch.randn(rows, self.k, dtype=torch.bfloat16, device="cuda")
        replays = 3 if rows >= 256 else 20
        return time_graph_us(
            lambda i: linear(x, copies[i], None) if rows == 1 else F.linear(x, copies[i]), len(copies), replays
        )


def _figure(sweep: ShapeSweep, rows: int, us: float) -> str:
    if rows <= 16:
        return f"{sweep.nbytes / us / 1e3:.0f} GB/s int4"
    return f"{2 * rows * sweep.n * sweep.k / us / 1e6:.0f} TFLOP/s"


def tune(
    budget_s: float,
    write: Callable[[dict[str, object], dict[str, object]], None],
    buckets: list[int],
    entries: dict[str, object],
    timings: dict[str, object],
) -> None:
    """Times the candidates of every entry of `buckets` into `entries` and `timings` (replacing what they held);
    `write(entries, timings)` after each entry (a timeout leaves a table)."""
    started = time.monotonic()
    sweeps = {name: ShapeSweep(n, k) for name, (n, k) in SHAPES.items()}
    ranked_gemv: dict[str, list[Int4Config]] = {}
    order = [b for b in [1, ROW_BUCKETS[-1], *ROW_BUCKETS[1:-1]] if b in buckets]
    for bucket in order:
        for name, sweep in sweeps.items():
            if time.monotonic() - started > budget_s:
                print(f"budget spent: {table_key(sweep.n, sweep.k, bucket)} not timed", flush=True)
                continue
            results = sweep.time_all(candidates(bucket, ranked_gemv.get(name, [])), bucket)
            if bucket == 1:
                results = sorted(results + sweep.time_all(with_pdl(results[:PDL_TRIES]), bucket), key=lambda r: r[0])
            if not results:
                continue
            if bucket == 1:
                ranked_gemv[name] = [c for _, c in results if c.kernel == "gemv"]
            best_us, best = results[0]
            key = table_key(sweep.n, sweep.k, bucket)
            entries[key] = best.to_json()
            timing: dict[str, object] = {"us": best_us, "candidates": len(results)}
            line = f"{name} rows {bucket}: {best.kernel} {best.meta} {best_us:.1f} us {_figure(sweep, bucket, best_us)}"
            if bucket in (1, ROW_BUCKETS[-1]):
                timing["bf16_us"] = bf16 = sweep.bf16_us(bucket)
                line += f"; bf16 {bf16:.1f} us, int4 x{bf16 / best_us:.2f}"
            timings[key] = timing
            write(entries, timings)
            print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True, help="the table JSON to write")
    parser.add_argument("--budget-s", type=float, default=140.0, help="stop timing new entries after this")
    parser.add_argument("--buckets", default=",".join(map(str, ROW_BUCKETS)), help="row buckets to sweep")
    args = parser.parse_args()
    buckets = [int(b) for b in args.buckets.split(",")]
    if not set(buckets) <= set(ROW_BUCKETS):
        parser.error(f"--buckets {args.buckets}: each must be one of {ROW_BUCKETS}")
    committed = json.loads(TABLE_PATH.read_text()) if TABLE_PATH.exists() else {}
    limits = measure_limits(torch.bfloat16)
    print(f"copy bandwidth {limits.copy_bandwidth_gb_s:.0f} GB/s ({limits.device_name})", flush=True)

    def write(entries: dict[str, object], timings: dict[str, object]) -> None:
        table = {
            "device": limits.device_name,
            "copy_gb_s": limits.copy_bandwidth_gb_s,
            "entries": entries,
            "timings": timings,
        }
        args.out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")

    tune(args.budget_s, write, buckets, dict(committed.get("entries", {})), dict(committed.get("timings", {})))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
