"""The expert kernels' launches at decode sizes (Qwen3-30B-A3B: 128 experts, top 8, hidden 2048, intermediate 768;
bf16): gate_up and down (with its pairs' sum) timed apart over a grid of tiles (`launch.Tiles`), then the whole layer
with each size's fastest pair against `moe_tiles`' choice. Timed as CUDA-graph replays over several layers' weights
in turn (`engine.tuning.timing.time_graph_us`). Prints a JSON line per measurement; writes moe_tiles.json.

python3 -m bench.kernels.moe_tiles --out $OUT     (GPU only)
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import triton

from bench.kernels.moe import HIDDEN, INTERMEDIATE, NUM_EXPERTS, NUM_LAYERS, TOP_K
from engine.layers.moe import launch, torch_moe, triton_moe
from engine.layers.moe.launch import MoETiles, Tiles
from engine.tuning.limits import measure_limits
from engine.tuning.timing import time_graph_us

GRID = {"block_n": (16, 32, 64), "block_k": (64, 128, 256), "num_warps": (2, 4, 8), "num_stages": (3, 4)}
FINALISTS = 6  # the fastest tiles at one token, timed again at every other size
REPLAYS = 200


class Case:
    """One decode size's inputs: every layer's experts and routing (distinct experts per token)."""

    def __init__(self, num_tokens: int) -> None:
        def weights(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, device="cuda", dtype=torch.bfloat16) / shape[-1] ** 0.5

        self.x = torch.randn(num_tokens, HIDDEN, device="cuda", dtype=torch.bfloat16)
        self.w13 = [weights(NUM_EXPERTS, 2 * INTERMEDIATE, HIDDEN) for _ in range(NUM_LAYERS)]
        self.w2 = [weights(NUM_EXPERTS, HIDDEN, INTERMEDIATE) for _ in range(NUM_LAYERS)]
        ids = [torch.stack([torch.randperm(NUM_EXPERTS)[:TOP_K] for _ in range(num_tokens)]) for _ in self.w13]
        self.topk_ids = [i.to(device="cuda", dtype=torch.int32) for i in ids]
        self.topk_weights = torch.softmax(torch.randn(num_tokens, TOP_K, device="cuda"), dim=-1)
        self.pair_weights = self.topk_weights.flatten().contiguous()
        self.default = launch.moe_tiles(num_tokens * TOP_K, NUM_EXPERTS, torch.bfloat16)
        pairs = [launch.pair_blocks(i, NUM_EXPERTS, 0, self.default.block_m) for i in self.topk_ids]
        self.pairs = pairs
        self.act = [
            triton_moe.run_gate_up(self.x, w, p, self.default.gate_up) for w, p in zip(self.w13, pairs, strict=True)
        ]

    def gate_up_us(self, tiles: Tiles) -> float:
        return time_graph_us(
            lambda i: triton_moe.run_gate_up(self.x, self.w13[i], self.pairs[i], tiles), NUM_LAYERS, REPLAYS
        )

    def down_us(self, tiles: Tiles) -> float:
        def run(i: int) -> object:
            return triton_moe.run_down(self.act[i], self.w2[i], self.pair_weights, self.pairs[i], tiles)

        return time_graph_us(run, NUM_LAYERS, REPLAYS)

    def layer_us(self, tiles: MoETiles) -> float:
        def run(i: int) -> object:
            x, w13, w2 = self.x, self.w13[i], self.w2[i]
            return triton_moe.fused_moe(x, w13, w2, self.topk_weights, self.topk_ids[i], 0, tiles)

        return time_graph_us(run, NUM_LAYERS, REPLAYS)

    def rel_err(self, tiles: MoETiles) -> float:
        x, w13, w2, ids = self.x, self.w13[0], self.w2[0], self.topk_ids[0]
        expected = torch_moe.fused_moe(x.float(), w13.float(), w2.float(), self.topk_weights, ids, 0)
        got = triton_moe.fused_moe(x, w13, w2, self.topk_weights, ids, 0, tiles).float()
        return float((got - expected).norm() / expected.norm())


def _timed(time_us: Callable[[Tiles], float], tiles: Tiles) -> float | None:
    """us per layer, or None where the tiles do not launch (shared memory, registers)."""
    try:
        return time_us(tiles)
    except (triton.runtime.errors.OutOfResources, RuntimeError) as e:
        print(json.dumps({"tiles": str(tiles), "skipped": str(e).splitlines()[0]}), flush=True)
        return None


def _sweep(case: Case, kernel: str, candidates: list[Tiles]) -> list[tuple[float, Tiles]]:
    time_us = case.gate_up_us if kernel == "gate_up" else case.down_us
    rows = []
    for tiles in candidates:
        us = _timed(time_us, tiles)
        if us is not None:
            rows.append((us, tiles))
            print(json.dumps({"kernel": kernel, "tokens": case.x.shape[0], "tiles": str(tiles), "us": us}), flush=True)
    return sorted(rows, key=lambda row: row[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", default="1,2,4,8", help="comma-separated batch sizes; the first sweeps the grid")
    args = parser.parse_args()
    limits = measure_limits(torch.bfloat16)
    grid = [Tiles(*values) for values in itertools.product(*GRID.values())]
    result: dict[str, Any] = {"device": limits.device_name, "copy_gb_s": limits.copy_bandwidth_gb_s, "sizes": {}}
    finalists: dict[str, list[Tiles]] = {}
    for num_tokens in [int(t) for t in args.tokens.split(",")]:
        case = Case(num_tokens)
        best = {}
        for kernel in ("gate_up", "down"):
            default = getattr(case.default, kernel)
            candidates = finalists.get(kernel, grid)
            ranked = _sweep(case, kernel, [default, *(t for t in candidates if t != default)])
            finalists.setdefault(kernel, [tiles for _, tiles in ranked[:FINALISTS]])
            best[kernel] = ranked[0][1]
        tuned = MoETiles(case.default.block_m, best["gate_up"], best["down"])
        row = {
            "default": str(case.default),
            "default_us": case.layer_us(case.default),
            "best": str(tuned),
            "best_us": case.layer_us(tuned),
            "best_rel_err": case.rel_err(tuned),
        }
        result["sizes"][num_tokens] = row
        print(json.dumps({"tokens": num_tokens, **row}), flush=True)
        del case
    (args.out / "moe_tiles.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
