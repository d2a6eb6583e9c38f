"""The host tier of KV blocks on the GPU (issue 31, engine.kv_tier): two measurements on one model.

1. Prefix tier (W9-like): `--num-prefixes` shared system prompts of `--prefix-len` tokens, each request one of them
   plus `--suffix-len` unique tokens, `--output-len` tokens out, one request at a time, round-robin over the
   prefixes. The device pool (`--num-blocks`) holds fewer prefixes than there are, so in round-robin order each
   prefix has left the device by the time it comes back (LRU). The first round computes every prefix; the second
   round's TTFTs are the figures: without a host tier each prefix is recomputed, with one (`--swap-space` GiB) it is
   copied back from the host.
2. Swap vs recompute at each `--contexts` length L: what a preempted request with L tokens of KV costs to resume.
   Recompute: the TTFT of a fresh, unique L-token prompt on the idle engine without a host tier (its prefill). Swap:
   the copy of its ceil(L / block_size) blocks to pinned host memory and back (`HostKVCopier`), synchronized.

Run: python -m bench.offline.kv_tier --model-shape qwen3-8b --json out.json (see scripts/gpu/kv_tier.sh).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

import torch

from bench.reporting.stats import percentile
from common.sampling_params import SamplingParams
from engine.kv_tier.copier import HostKVCopier
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.models.shapes import SHAPE_PREFIX


def build(args: argparse.Namespace, swap_space: float) -> LLMEngine:
    kwargs: dict[str, Any] = {
        "dtype": args.dtype,
        "num_blocks": args.num_blocks,
        "swap_space": swap_space,
        "max_num_seqs": args.max_num_seqs,
    }
    if args.model_shape:
        return LLMEngine(engine_config(SHAPE_PREFIX + args.model_shape, load_format="dummy", **kwargs))
    return LLMEngine(engine_config(args.model, **kwargs))


def ttft_s(engine: LLMEngine, req_id: str, prompt: list[int], output_len: int) -> float:
    """Run one request alone to its end; the time to its first token."""
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    start = time.perf_counter()
    engine.add_request(req_id, prompt, params)
    first = None
    while engine.has_unfinished_requests():
        outputs = engine.step()
        if first is None and any(o.req_id == req_id and o.new_token_ids for o in outputs):
            first = time.perf_counter() - start
    assert first is not None
    return first


def prefix_tier_run(engine: LLMEngine, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    vocab = engine.info.vocab_size
    prefixes = [[rng.randrange(vocab) for _ in range(args.prefix_len)] for _ in range(args.num_prefixes)]
    ttfts: list[list[float]] = [[], []]
    for round_index in range(2):
        for i, prefix in enumerate(prefixes):
            prompt = prefix + [rng.randrange(vocab) for _ in range(args.suffix_len)]
            ttfts[round_index].append(ttft_s(engine, f"r{round_index}-{i}", prompt, args.output_len))
    kv = engine.kv_cache_manager
    return {
        "swap_space_gib": engine.config.cache.swap_space,
        "ttft_round1_ms_mean": 1000 * sum(ttfts[0]) / len(ttfts[0]),
        "ttft_round2_ms_p50": 1000 * percentile(ttfts[1], 50),
        "ttft_round2_ms_mean": 1000 * sum(ttfts[1]) / len(ttfts[1]),
        "host_hit_tokens": kv.stats.host_hits,
        "prefix_hit_rate": kv.stats.hit_rate,
    }


def swap_vs_recompute(engine: LLMEngine, contexts: list[int], seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    pool = engine.executor.kv_pools[0]
    block_size = engine.info.block_size
    copier = HostKVCopier(pool, -(-max(contexts) // block_size))
    rows = []
    for length in contexts:
        prompt = [rng.randrange(engine.info.vocab_size) for _ in range(length)]
        ttft_s(engine, f"warm-{length}", prompt[::-1], 1)
        recompute = ttft_s(engine, f"ctx-{length}", prompt, 1)
        num_blocks = -(-length // block_size)
        blocks, slots = list(range(num_blocks)), list(range(num_blocks))
        copier.to_host(blocks, slots)
        copier.to_device(slots, blocks)
        _sync(pool)
        start = time.perf_counter()
        copier.to_host(blocks, slots)
        _sync(pool)
        out_s = time.perf_counter() - start
        start = time.perf_counter()
        copier.to_device(slots, blocks)
        _sync(pool)
        in_s = time.perf_counter() - start
        block_nbytes = pool[0].numel() * pool.element_size()
        rows.append(
            {
                "context_tokens": length,
                "recompute_ms": 1000 * recompute,
                "swap_out_ms": 1000 * out_s,
                "swap_in_ms": 1000 * in_s,
                "swap_gb_per_s": 2 * num_blocks * block_nbytes / (out_s + in_s) / 1e9,
            }
        )
    return rows


def _sync(pool: torch.Tensor) -> None:
    if pool.device.type == "cuda":
        torch.cuda.synchronize(pool.device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--model-shape", default=None, help="random weights of a known shape, e.g. qwen3-8b")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--num-blocks", type=int, default=1280, help="device KV pool: 20,480 tokens at 16 a block")
    parser.add_argument("--swap-space", type=float, default=16.0, help="host tier in GiB")
    parser.add_argument(
        "--max-num-seqs", type=int, default=8, help="requests run one at a time: fewer graphs to capture"
    )
    parser.add_argument("--num-prefixes", type=int, default=8)
    parser.add_argument("--prefix-len", type=int, default=4096)
    parser.add_argument("--suffix-len", type=int, default=100)
    parser.add_argument("--output-len", type=int, default=8)
    parser.add_argument("--contexts", default="2048,16384")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    result: dict[str, Any] = {"args": vars(args), "prefix_tier": []}
    for swap_space in (0.0, args.swap_space):
        engine = build(args, swap_space)
        result["device_name"] = (
            engine.info.device if engine.runner.device.type != "cuda" else torch.cuda.get_device_name()
        )
        result["prefix_tier"].append(prefix_tier_run(engine, args))
        print(json.dumps(result["prefix_tier"][-1]), flush=True)
        if not swap_space:
            # NOTE: on the engine without a host tier: its prefills evict no blocks to the host.
            result["swap_vs_recompute"] = swap_vs_recompute(
                engine, [int(n) for n in args.contexts.split(",")], args.seed
            )
            for row in result["swap_vs_recompute"]:
                print(json.dumps(row), flush=True)
        del engine
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
