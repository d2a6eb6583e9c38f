"""The FP8 GEMV's tiles per Qwen3-8B projection shape, tuned at batch 1 on the GPU into fp8_gemv_tiles.json beside
engine/layers/triton_fp8_linear.py (the table the kernel reads; shapes not swept keep their entries), a copy to --out.

The sweep runs in two rounds: every tile shape with 4 stages, then the 3 fastest with 1-3 stages, then the 3 fastest
as programmatic dependent launches (pdl: the kernel starts before the previous one has finished; in the timing graph
that is the same GEMV on other weights, which signals at its start, as RMSNorm and SiLU-mul do in a decoder layer);
a candidate whose output is off by 1e-2 or more (relative norm against float32) is dropped before it is timed. Each
is timed as CUDA-graph replays (as the engine's decode steps run), so launch overhead does not count: each graph
holds one call per weight copy, the copies rotating past the L2. The bf16 Triton GEMV on the same shape is timed
too, as weight bytes / time against the copy bandwidth.

python3 -m engine.layers.tune_fp8_gemv --out $OUT [--shapes NAME...]   (writes tune_fp8_gemv.json; GPU only)
bench/kernels/fp8_gemv.py runs the same sweep beside the prefill path (`--write-table`: into the same table).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
import triton

from engine.layers.quant.fp8 import quantize_fp8_rows
from engine.layers.triton_fp8_linear import (
    TILES_PATH,
    TUNED_TILES,
    Fp8GemvTiles,
    default_tiles,
    fp8_gemv,
    tiles_json,
)
from engine.layers.triton_gemv import linear
from engine.tuning.limits import measure_limits

W = TypeVar("W")

SHAPES = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (24576, 4096),
    "down": (4096, 12288),
    "lm_head": (151936, 4096),  # NOTE: with quantize_lm_head; swept only when named
}
PROJECTIONS = [name for name in SHAPES if name != "lm_head"]
# NOTE: tiles from 8 values per thread (no replicated loads) to 128 float32 partial sums per thread (no spills).
SWEEP = [
    Fp8GemvTiles(n, k, w, unroll=u)
    for n, k, w, u in itertools.product((4, 8, 16, 32), (256, 512, 1024, 2048), (4, 8), (1, 4))
    if 256 * w <= n * k <= 4096 * w
]
STAGES_SWEEP = (1, 2, 3)
MAX_ERROR = 1e-2
"""A candidate's relative error (norm) against float32: bf16 output rounding is ~2e-3."""


def time_graph_us(fn: Callable[[W], object], weights: Sequence[W]) -> float:
    """Median us per fn(weight) call, replaying one CUDA graph of a call per weight (compiled beforehand)."""
    for weight in weights:
        fn(weight)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for weight in weights:
            fn(weight)
    return float(triton.testing.do_bench(graph.replay, warmup=10, rep=25, return_mode="median")) * 1e3 / len(weights)


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
    sweep: dict[str, Fp8GemvTiles | None] = {}
    reference = x.float() @ (weights[0][0].float() * weights[0][1][:, None]).T
    for tiles in [None, *SWEEP]:
        _time_tiles(x, weights, reference, tiles, sweep, timings, errors)
    fastest = sorted((name for name in timings if name != "default"), key=timings.__getitem__)[:3]
    for name in fastest:
        base = sweep[name]
        for stages in STAGES_SWEEP:
            if base is not None:
                _time_tiles(x, weights, reference, dataclasses.replace(base, num_stages=stages), sweep, timings, errors)
    for name in sorted(timings, key=timings.__getitem__)[:3]:
        base = sweep[name]
        if base is not None:
            _time_tiles(x, weights, reference, dataclasses.replace(base, pdl=True), sweep, timings, errors)
    best = min(timings, key=timings.__getitem__)
    row |= {"fp8_us": timings["default"], "fp8_pct_of_copy": 100 * gigabytes / timings["default"] * 1e6 / copy_gb_s}
    best_pct = 100 * gigabytes / timings[best] * 1e6 / copy_gb_s
    row |= {"best": best, "best_us": timings[best], "best_pct_of_copy": best_pct}
    row |= {"best_tiles": sweep[best] or default_tiles(n, k), "sweep_us": timings, "sweep_errors": errors}
    return row


def _time_tiles(
    x: torch.Tensor,
    weights: list[tuple[torch.Tensor, torch.Tensor]],
    reference: torch.Tensor,
    tiles: Fp8GemvTiles | None,
    sweep: dict[str, Fp8GemvTiles | None],
    timings: dict[str, float],
    errors: dict[str, str],
) -> None:
    """Times one tile shape (None: the default) into timings, or its error into errors (also an output off by
    more than MAX_ERROR against `reference`, the float32 product with weights[0], checked before timing); skips a
    non-dividing one."""
    n, k = weights[0][0].shape
    if tiles is not None and (n % tiles.block_n or k % tiles.block_k):
        return
    name = "default" if tiles is None else str(tiles)
    sweep[name] = tiles
    try:
        error = float((_run(x, tiles, weights[0]).float() - reference).norm() / reference.norm())
        if not error < MAX_ERROR:
            errors[name] = f"relative error {error:.1e} against float32"
            return
        timings[name] = round(time_graph_us(functools.partial(_run, x, tiles), weights), 2)
    except Exception as error:  # a tile shape that does not fit is recorded; the sweep goes on
        errors[name] = f"{type(error).__name__}: {str(error)[:120]}"


def write_table(rows: Iterable[dict[str, Any]], out: Path) -> None:
    """Each swept shape's fastest tiles into the kernel's table (the other shapes keep theirs), a copy into `out`."""
    table = TUNED_TILES | {(row["n"], row["k"]): row["best_tiles"] for row in rows}
    TILES_PATH.write_text(tiles_json(table) + "\n")
    (out / TILES_PATH.name).write_text(tiles_json(table) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
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
        shown = {key: v for key, v in rows[name].items() if not key.startswith("sweep")}
        print(name, json.dumps(shown, default=str), flush=True)
        # NOTE: rewritten after every shape, so a run cut short keeps the shapes it finished.
        (args.out / "tune_fp8_gemv.json").write_text(json.dumps(result, indent=1, default=str))
        write_table(rows.values(), args.out)


if __name__ == "__main__":
    main()
