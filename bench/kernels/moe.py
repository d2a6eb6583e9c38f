"""The MoE layer at decode sizes on Qwen3-30B-A3B's shapes (128 experts, top 8, hidden 2048, intermediate 768; bf16):
router + routing + experts per layer: the Triton routing (`triton_moe.moe`) with sync counters (the pairs' sum in the
down projection's launch) and without, and torch's routing (softmax, top-k, renormalization:
`routing.select_experts`) before the same experts. Timed as CUDA-graph replays of several layers' weights in turn
(so the L2 never holds the layer being read), reported per layer and as the routed experts' weight bytes over that
time.

python3 -m bench.kernels.moe --out $OUT     (writes bench_moe.json; GPU only)
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import triton

from engine.layers.kernels import moe_sync_counters
from engine.layers.moe import torch_moe, triton_moe
from engine.layers.moe.routing import select_experts
from engine.layers.triton_gemv import linear
from engine.tuning.limits import measure_limits

NUM_EXPERTS, TOP_K, HIDDEN, INTERMEDIATE = 128, 8, 2048, 768
NUM_LAYERS = 8  # 8 x 1.2 GB of experts: far past any L2
Layer = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
MoEPath = Callable[[torch.Tensor, Layer], torch.Tensor]
_SYNC: dict[torch.device, torch.Tensor] = {}  # one layer's counters, left at zero by every call


def _layers() -> list[Layer]:
    def weights(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16) / shape[-1] ** 0.5

    return [
        (
            weights(NUM_EXPERTS, HIDDEN),
            weights(NUM_EXPERTS, 2 * INTERMEDIATE, HIDDEN),
            weights(NUM_EXPERTS, HIDDEN, INTERMEDIATE),
        )
        for _ in range(NUM_LAYERS)
    ]


def _summed_in_down(x: torch.Tensor, layer: Layer) -> torch.Tensor:
    gate, w13, w2 = layer
    return triton_moe.moe(x, linear(x, gate, None), w13, w2, TOP_K, True, 0, _SYNC[x.device])


def _triton_routing(x: torch.Tensor, layer: Layer) -> torch.Tensor:
    gate, w13, w2 = layer
    return triton_moe.moe(x, linear(x, gate, None), w13, w2, TOP_K, True, 0)


def _torch_routing(x: torch.Tensor, layer: Layer) -> torch.Tensor:
    gate, w13, w2 = layer
    return triton_moe.fused_moe(x, w13, w2, *select_experts(linear(x, gate, None), TOP_K, True), 0)


def time_layer_us(path: MoEPath, x: torch.Tensor, layers: list[Layer]) -> float:
    """Median us per layer of `path` over every layer in turn, replayed as one CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for layer in layers:  # NOTE: compiles and autotunes outside the capture
            path(x, layer)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for layer in layers:
            path(x, layer)
    return float(triton.testing.do_bench(graph.replay, warmup=25, rep=100, return_mode="median")) * 1e3 / len(layers)


def _error(path: MoEPath, x: torch.Tensor, layer: Layer) -> float:
    gate, w13, w2 = layer
    expected = torch_moe.moe(x.float(), linear(x, gate, None), w13.float(), w2.float(), TOP_K, True, 0)
    return float((path(x, layer).float() - expected).norm() / expected.norm())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", default="1,2,4,8", help="comma-separated batch sizes")
    args = parser.parse_args()
    limits = measure_limits(torch.bfloat16)
    layers = _layers()
    expert_bytes = 3 * INTERMEDIATE * HIDDEN * 2
    result: dict[str, Any] = {"device": limits.device_name, "copy_gb_s": limits.copy_bandwidth_gb_s, "paths": {}}
    for num_tokens in [int(t) for t in args.tokens.split(",")]:
        x = torch.randn(num_tokens, HIDDEN, device="cuda", dtype=torch.bfloat16)
        routed = min(NUM_EXPERTS, num_tokens * TOP_K) * expert_bytes
        _SYNC[x.device] = moe_sync_counters(HIDDEN).to(x.device)
        paths = (("pairs summed in down", _summed_in_down), ("triton routing", _triton_routing))
        for name, path in (*paths, ("torch routing", _torch_routing)):
            us = time_layer_us(path, x, layers)
            row = {"us_per_layer": us, "expert_gb_s_at_most": routed / us / 1e3, "rel_err": _error(path, x, layers[0])}
            result["paths"][f"{name} T={num_tokens}"] = row
            print(name, num_tokens, json.dumps(row), flush=True)
    (args.out / "bench_moe.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
