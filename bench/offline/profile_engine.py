"""Diagnostic profile of the engine on a GPU: decode steps (busy vs idle GPU, top kernels) and one prefill.

python3 -m bench.offline.profile_engine --out $OUT   (writes profile.json)
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from typing import Any

import torch

from bench.offline.gpu_profile import device_intervals, profile_decode, timeline_summary
from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.models.shapes import SHAPE_PREFIX


def prefill_profile(engine: LLMEngine, num_tokens: int) -> dict[str, Any]:
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    vocab = engine.info.vocab_size
    for warm in range(2):
        engine.add_request(f"warm-{warm}", [(j * 31 + warm) % vocab for j in range(num_tokens)], params)
        while engine.has_unfinished_requests():
            engine.step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    engine.add_request("timed", [(j * 37 + 5) % vocab for j in range(num_tokens)], params)
    while engine.has_unfinished_requests():
        engine.step()
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - start) * 1e3
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.add_request("profiled", [(j * 41 + 3) % vocab for j in range(num_tokens)], params)
        while engine.has_unfinished_requests():
            engine.step()
        torch.cuda.synchronize()
    return {"num_tokens": num_tokens, "wall_ms": wall_ms} | timeline_summary(device_intervals(prof), 1, top=15)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    results: dict[str, Any] = {"device": torch.cuda.get_device_name()}
    cases = [("qwen3-8b", 2048, [(1, 128)], True), ("qwen3-0.6b", 16384, [(64, 512), (256, 512)], False)]
    for shape, num_blocks, decode_cases, with_prefill in cases:
        engine = LLMEngine(
            engine_config(SHAPE_PREFIX + shape, load_format="dummy", num_blocks=num_blocks, max_num_seqs=256)
        )
        for batch, context in decode_cases:
            key = f"{shape} decode bs{batch} ctx{context}"
            results[key] = profile_decode(engine, batch, context, num_steps=20)
            print(key, json.dumps(results[key], indent=1), flush=True)
        if with_prefill:
            key = f"{shape} prefill 2048"
            results[key] = prefill_profile(engine, 2048)
            print(key, json.dumps(results[key], indent=1), flush=True)
        del engine
        gc.collect()
        torch.cuda.empty_cache()
    (args.out / "profile.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
