"""Micro-benchmark of the fused Triton layer kernels against the torch eager ops they replace, at the Qwen3-8B
shape in bf16 (hidden 4096, 32/8 heads of 128, intermediate 12288), for 1, 64, 256 and 2048 tokens.

The eager side is the torch set (`engine.layers.torch_ops`), except for RoPE: there it is the
model's path before the fusion (q/k RMSNorm, `RotaryEmbedding`'s rotation on full-width cos/sin, `store_kv`),
since the torch set's store skips padding slots with a host sync, which no CUDA graph can hold (the bench has none).

Per op and token count: us per call (median of CUDA-graph replays over enough distinct inputs to defeat the L2),
GB/s of the bytes the op must read and write (the same count for both paths) and as a share of the copy bandwidth
measured in the same run, kernels launched per call (torch profiler), and how far the fused outputs are from the
torch path's (largest ulp distance, count of differing elements).
Usage: python bench/kernels/layers.py [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import triton
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.attention.backend import store_kv
from engine.layers import torch_ops, triton_activation, triton_rms_norm, triton_rope
from engine.layers.rotary_embedding import cos_sin_cache
from engine.tuning.limits import measure_limits
from engine.tuning.timing import time_graph_ms

DEVICE = "cuda"
DTYPE = torch.bfloat16
HIDDEN, HQ, HKV, D, INTERMEDIATE = 4096, 32, 8, 128, 12288
EPS, ROPE_THETA, MAX_POSITION = 1e-6, 1e6, 40960
PAGE, NUM_BLOCKS = 16, 1024
TOKEN_COUNTS = (1, 64, 256, 2048)
L2_DEFEAT_BYTES = 256 << 20
ITEM = DTYPE.itemsize
Inputs = tuple[torch.Tensor, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Op:
    """One fused kernel and the eager torch ops it replaces; both take the same inputs and return comparable outputs."""

    name: str
    bytes_per_token: int
    weight_bytes: int
    make_inputs: Callable[[int], Inputs]
    fused: Callable[..., Sequence[torch.Tensor]]
    eager: Callable[..., Sequence[torch.Tensor]]


def kernels_per_call(call: Callable[[], object]) -> int:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return sum(1 for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA)


def compare(fused: torch.Tensor, eager: torch.Tensor) -> tuple[int, int, float]:
    """(largest distance in representable bf16 values, number of elements that differ, largest absolute difference).

    NOTE: ulps mislead near zero (a sign flip of two tiny values is thousands); the absolute difference does not.
    """

    def ordered(t: torch.Tensor) -> torch.Tensor:
        bits = t.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)

    distance = (ordered(fused) - ordered(eager)).abs()
    return int(distance.max()), int((distance > 0).sum()), float((fused.float() - eager.float()).abs().max())


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def randn(*shape: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, device=DEVICE).to(DTYPE)


def make_ops(gen: torch.Generator) -> list[Op]:
    weight, q_weight, k_weight = (1 + 0.3 * randn(size, gen=gen) for size in (HIDDEN, D, D))
    return [
        Op(
            "rms_norm",
            2 * HIDDEN * ITEM,
            HIDDEN * ITEM,
            lambda t: (randn(t, HIDDEN, gen=gen),),
            lambda x: (triton_rms_norm.rms_norm(x, weight, EPS),),
            lambda x: (torch_ops.rms_norm(x, weight, EPS),),
        ),
        Op(
            "fused_add_rms_norm",
            4 * HIDDEN * ITEM,
            HIDDEN * ITEM,
            lambda t: (randn(t, HIDDEN, gen=gen), randn(t, HIDDEN, gen=gen)),
            lambda x, residual: triton_rms_norm.fused_add_rms_norm(x, residual, weight, EPS),
            lambda x, residual: torch_ops.fused_add_rms_norm(x, residual, weight, EPS),
        ),
        _rope_op(q_weight, k_weight, gen),
        Op(
            "silu_and_mul",
            3 * INTERMEDIATE * ITEM,
            0,
            lambda t: (randn(t, 2 * INTERMEDIATE, gen=gen),),
            lambda gate_up: (triton_activation.silu_and_mul(gate_up),),
            lambda gate_up: (torch_ops.silu_and_mul(gate_up),),
        ),
    ]


def _rope_op(q_weight: torch.Tensor, k_weight: torch.Tensor, gen: torch.Generator) -> Op:
    """qk_norm_rope_store: the fused Triton kernel against RMSNorm, RoPE and the KV store in eager torch."""
    cos_sin = cos_sin_cache(D, MAX_POSITION, ROPE_THETA, None).to(DEVICE)
    cos, sin = (torch.cat((half, half), dim=-1) for half in cos_sin.chunk(2, dim=-1))
    # NOTE: two layers, so the layer written is a strided view as in the engine's pool.
    pool = randn(NUM_BLOCKS, 2, 2, PAGE, HKV, D, gen=gen)

    def rope_inputs(num_tokens: int) -> Inputs:
        positions = torch.randint(0, MAX_POSITION, (num_tokens,), generator=gen, device=DEVICE)
        slots = torch.randperm(NUM_BLOCKS * PAGE, generator=gen, device=DEVICE)[:num_tokens]
        return randn(num_tokens, (HQ + 2 * HKV) * D, gen=gen), positions, slots, pool[:, 1]

    def rope_fused(qkv: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, kv_cache: torch.Tensor) -> Inputs:
        args = (qkv, positions, cos_sin, q_weight, k_weight, EPS, kv_cache, slots, HQ, HKV, D)
        return triton_rope.qk_norm_rope_store(*args), kv_cache

    def rope_eager(qkv: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, kv_cache: torch.Tensor) -> Inputs:
        num_tokens = qkv.shape[0]
        q, k, v = qkv.split([HQ * D, HKV * D, HKV * D], dim=1)
        q = torch_ops.rms_norm(q.view(num_tokens, HQ, D), q_weight, EPS)
        k = torch_ops.rms_norm(k.view(num_tokens, HKV, D), k_weight, EPS)
        cos_t, sin_t = cos[positions].to(DTYPE).unsqueeze(1), sin[positions].to(DTYPE).unsqueeze(1)
        q, k = q * cos_t + rotate_half(q) * sin_t, k * cos_t + rotate_half(k) * sin_t
        store_kv(k, v.view(num_tokens, HKV, D), kv_cache, slots, PAGE)
        return q, kv_cache

    rope_bytes = ((HQ + 2 * HKV) * D + HQ * D + 2 * HKV * D) * ITEM + D * 4 + 2 * 8
    return Op("qk_norm_rope_store", rope_bytes, 2 * D * ITEM, rope_inputs, rope_fused, rope_eager)


def bench_op(op: Op, num_tokens: int, copy_gb_s: float) -> dict[str, Any]:
    nbytes = op.bytes_per_token * num_tokens + op.weight_bytes
    variants = [op.make_inputs(num_tokens) for _ in range(max(1, min(64, -(-L2_DEFEAT_BYTES // nbytes))))]
    row: dict[str, Any] = {"op": op.name, "tokens": num_tokens, "variants": len(variants), "bytes": nbytes}
    for path, fn in (("fused", op.fused), ("eager", op.eager)):
        us = time_graph_ms([functools.partial(fn, *inputs) for inputs in variants]) * 1e3
        row |= {f"{path}_us": us, f"{path}_gb_s": nbytes / us / 1e3}
        row[f"{path}_kernels"] = kernels_per_call(functools.partial(fn, *variants[0]))
    row["speedup"] = row["eager_us"] / row["fused_us"]
    row["fused_pct_of_copy"] = 100 * row["fused_gb_s"] / copy_gb_s
    fused_out = op.fused(*[t.clone() for t in variants[0]])
    eager_out = op.eager(*[t.clone() for t in variants[0]])
    diffs = [compare(f, e) for f, e in zip(fused_out, eager_out, strict=True)]
    row["max_ulp"] = max(d[0] for d in diffs)
    row["differing_elements"] = sum(d[1] for d in diffs)
    row["max_abs_diff"] = max(d[2] for d in diffs)
    print(json.dumps(row))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description="Fused Triton layer kernels vs the torch eager ops they replace")
    parser.add_argument("--out", type=Path, default=Path("."))
    out = parser.parse_args().out / "bench_triton_layers.json"
    gen = torch.Generator(DEVICE).manual_seed(0)
    limits = measure_limits(DTYPE)
    versions = {"torch": torch.__version__, "triton": triton.__version__}
    results: dict[str, Any] = {"limits": dataclasses.asdict(limits), **versions, "rows": []}
    print(json.dumps(results))
    with torch.no_grad():
        for op in make_ops(gen):
            for num_tokens in TOKEN_COUNTS:
                results["rows"].append(bench_op(op, num_tokens, limits.copy_bandwidth_gb_s))
                out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
