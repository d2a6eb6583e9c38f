"""Micro-benchmark of the Triton attention kernels on the Qwen3-8B attention shape (one layer), against torch SDPA.

Decode: batch 1/64/256 at contexts 1k/4k/8k, as KV-read bandwidth vs the copy bandwidth measured in the same run
(`--kv-cache-dtype fp8`: the pool in float8_e4m3fn, read at 1 byte per element; SDPA still reads bf16).
Prefill: 2048-token prompts and a chunk over a cached prefix, as TFLOP/s vs the measured bf16 matmul.
All timings are CUDA-graph replays (median over events), over enough distinct inputs to defeat the L2.
Usage: python3 -m bench.kernels.attention [--out DIR] [--kv-cache-dtype auto|fp8] [--sections decode,prefill,...]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.attention.triton_backend import TritonAttentionBackend, num_kv_splits
from engine.attention.triton_decode import DecodeTiles
from engine.attention.triton_prefill import PrefillTiles, prefill_attention
from engine.tuning.attention_steps import (
    DEVICE,
    DTYPE,
    HKV,
    HQ,
    PAGE,
    SCALE,
    D,
    Step,
    decode_kernel_ms,
    kv_nbytes,
    make_step,
)
from engine.tuning.limits import DeviceLimits, measure_limits
from engine.tuning.sweep import sweep_row
from engine.tuning.timing import time_graph_ms

DECODE_BATCHES = (1, 64, 256)
DECODE_CONTEXTS = (1024, 4096, 8192)
KV_DTYPES = {"auto": DTYPE, "fp8": torch.float8_e4m3fn}
L2_DEFEAT_BYTES = 256 << 20
FAST_SDPA = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
DECODE_TILE_SWEEP = [DecodeTiles(n, w, s) for n in (32, 64, 128) for w in (4, 8) for s in (2, 3)]
PREFILL_TILE_SWEEP = [
    PrefillTiles(*shape)
    for shape in [(128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 2), (128, 32, 4, 3), (64, 64, 4, 3), (64, 32, 4, 2)]
]


def forward(backend: TritonAttentionBackend, layer: torch.Tensor, step: Step) -> torch.Tensor:
    return backend.forward(step[0], layer, step[3])


def sdpa_ms(batch: int, q_len: int, kv_len: int, variants: int, gen: torch.Generator) -> float | None:
    """Torch SDPA (flash / cuDNN / efficient; never math) on contiguous K/V of the same sizes; None if none runs."""
    calls = []
    for _ in range(variants):
        q, k, v = (
            torch.randn(batch, h, n, D, dtype=DTYPE, device=DEVICE, generator=gen)
            for h, n in ((HQ, q_len), (HKV, kv_len), (HKV, kv_len))
        )
        sdpa = functools.partial(F.scaled_dot_product_attention, is_causal=q_len > 1, scale=SCALE, enable_gqa=True)
        calls.append(functools.partial(sdpa, q, k, v))
    try:
        with sdpa_kernel(FAST_SDPA):
            return time_graph_ms(calls)
    except RuntimeError as error:
        print(f"  sdpa batch={batch} q={q_len} kv={kv_len} failed: {str(error).splitlines()[0]}")
        return None


def bench_decode(pool: torch.Tensor, limits: DeviceLimits, gen: torch.Generator) -> list[dict[str, Any]]:
    rows = []
    backend = TritonAttentionBackend(PAGE, SCALE)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    for batch in DECODE_BATCHES:
        for context in DECODE_CONTEXTS:
            kv_bytes = kv_nbytes(pool, batch * context)
            variants = max(1, min(64, -(-L2_DEFEAT_BYTES // kv_bytes)))
            steps = [make_step(pool, [(context - 1, 1)] * batch, gen) for _ in range(variants)]
            ms = time_graph_ms([functools.partial(forward, backend, pool[:, 1], s) for s in steps])
            base = sdpa_ms(batch, 1, context, variants, gen)
            row: dict[str, Any] = {"batch": batch, "context": context}
            row["splits"] = num_kv_splits(batch * HKV, context, num_sms)
            row |= {"triton_us": ms * 1e3, "triton_gb_s": kv_bytes / ms / 1e6}
            row |= {"sdpa_us": base * 1e3, "sdpa_gb_s": kv_bytes / base / 1e6} if base else {}
            row["pct_of_copy"] = 100 * row["triton_gb_s"] / limits.copy_bandwidth_gb_s
            rows.append(row)
            print(json.dumps(row))
    return rows


def bench_decode_sweeps(pool: torch.Tensor, gen: torch.Generator) -> list[dict[str, Any]]:
    """Tile shapes at batch 64 / 4k (one split), and split counts at batch 1 and 8 / 8k."""
    rows = []
    for tiles in DECODE_TILE_SWEEP:
        fn = functools.partial(decode_kernel_ms, pool, [(4095, 1)] * 64, 1, 1, tiles, gen)
        rows.append(sweep_row(f"decode b=64 ctx=4096 {tiles}", fn, kv_nbytes(pool, 64 * 4096)))
    for batch in (1, 8):
        for splits in (1, 4, 8, 16, 32):
            fn = functools.partial(decode_kernel_ms, pool, [(8191, 1)] * batch, 8 // batch, splits, DecodeTiles(), gen)
            rows.append(sweep_row(f"decode b={batch} ctx=8192 splits={splits}", fn, kv_nbytes(pool, batch * 8192)))
    return rows


def causal_flops(context: int, q_len: int) -> float:
    """QK^T and PV FLOPs of q_len causal queries after `context` cached tokens (masked pairs not counted)."""
    return 4.0 * HQ * D * (q_len * context + q_len * (q_len + 1) / 2)


def bench_prefill(pool: torch.Tensor, limits: DeviceLimits, gen: torch.Generator) -> list[dict[str, Any]]:
    rows = []
    backend = TritonAttentionBackend(PAGE, SCALE)
    cases: list[tuple[str, list[tuple[int, int]], int]] = [
        ("prompt 1x2048", [(0, 2048)], 1),
        ("prompts 4x2048", [(0, 2048)] * 4, 4),
        ("chunk 2048 after 6144 cached", [(6144, 2048)], 0),
    ]
    for name, requests, sdpa_batch in cases:
        ms = time_graph_ms([functools.partial(forward, backend, pool[:, 1], make_step(pool, requests, gen))])
        flops = sum(causal_flops(c, q) for c, q in requests)
        base = sdpa_ms(sdpa_batch, 2048, 2048, 1, gen) if sdpa_batch else None
        row: dict[str, Any] = {"name": name, "triton_us": ms * 1e3, "triton_tflop_s": flops / ms / 1e9}
        row |= {"sdpa_us": base * 1e3, "sdpa_tflop_s": flops / base / 1e9} if base else {}
        row["pct_of_matmul"] = 100 * row["triton_tflop_s"] / limits.matmul_tflops
        rows.append(row)
        print(json.dumps(row))
    q, _, _, m = make_step(pool, [(0, 2048)], gen)
    for tiles in PREFILL_TILE_SWEEP:
        args = (q, pool[:, 1], m.query_start_loc, m.seq_lens, m.block_table, torch.empty_like(q), SCALE, tiles)
        fn = functools.partial(time_graph_ms, [functools.partial(prefill_attention, *args)])
        rows.append(sweep_row(f"prefill 1x2048 {tiles}", fn, flops=causal_flops(0, 2048)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description="Triton attention kernels vs torch SDPA")
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--kv-cache-dtype", choices=sorted(KV_DTYPES), default="auto", help="the pool's dtype")
    parser.add_argument("--sections", default="decode,prefill,decode_sweeps", help="comma-separated, in order")
    args = parser.parse_args()
    suffix = "" if args.kv_cache_dtype == "auto" else f"_{args.kv_cache_dtype}"
    out = args.out / f"bench_triton_attention{suffix}.json"
    gen = torch.Generator(DEVICE).manual_seed(0)
    limits = measure_limits(DTYPE)
    results: dict[str, Any] = {"limits": dataclasses.asdict(limits), "torch": torch.__version__}
    results["kv_cache_dtype"] = args.kv_cache_dtype
    print(json.dumps(results))
    # NOTE: two layers, so the benchmarked layer is a strided view as in the engine's pool.
    pool = torch.randn(
        max(DECODE_BATCHES) * max(DECODE_CONTEXTS) // PAGE + 64,
        2,
        2,
        PAGE,
        HKV,
        D,
        dtype=DTYPE,
        device=DEVICE,
        generator=gen,
    ).to(KV_DTYPES[args.kv_cache_dtype])
    benches = {
        "decode": functools.partial(bench_decode, pool, limits, gen),
        "prefill": functools.partial(bench_prefill, pool, limits, gen),
        "decode_sweeps": functools.partial(bench_decode_sweeps, pool, gen),
    }
    for section in args.sections.split(","):
        results[section] = benches[section]()
        out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
