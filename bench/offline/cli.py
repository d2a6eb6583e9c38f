"""The offline workloads (engine in-process): W1-W4 of docs/workloads.md, and `idle` (GPU idle time between
decode steps), on real or random-weight models, with the physical limits and the transformers baseline."""

from __future__ import annotations

import argparse
import gc
from typing import Any

import torch

from bench.offline.baseline import hf_model_with_weights, run_transformers
from bench.offline.gpu_profile import profile_decode
from bench.offline.timed_run import run_workload, warm_up
from bench.reporting.limits import decode_bytes_per_step, prefill_flops
from bench.workloads import make_workload
from engine.config import KV_CACHE_DTYPES, QUANTIZATIONS
from engine.layers.linear import Linear
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.models.shapes import SHAPE_PREFIX
from engine.tuning.limits import measure_limits

WORKLOADS = ("w1", "w2", "w3", "w4", "idle")
_DEFAULT_NUM_PROMPTS = {"w1": 5, "w2": 5, "w3": 256, "w4": 64}
WARM_UP_REQUESTS = 3
"""Warm-up requests of the workload's longest prompt before the measured ones (bench.offline.timed_run.warm_up)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    model = p.add_mutually_exclusive_group()
    model.add_argument("--model", default=None, help="model folder or alias (real weights)")
    model.add_argument("--model-shape", default=None, help="random bf16 weights of a named shape, e.g. qwen3-8b")
    p.add_argument("--dtype", default="auto")
    p.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default="auto",
        help="weight quantization (engine's field); with --model-shape, gptq/awq quantize the random "
        "weights in memory into that checkpoint layout and load them as a checkpoint",
    )
    p.add_argument("--quantize-lm-head", action="store_true", help="the lm_head in the quantization too (fp8, int8)")
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto", help="KV pool, as the engine's field")
    p.add_argument("--num-prompts", type=int, default=None, help="default: 5 (w1, w2), 256 (w3), 64 (w4)")
    p.add_argument("--input-len", type=int, default=None, help="idle: the context of every request (default 512)")
    p.add_argument("--output-len", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--num-blocks", type=int, default=None)
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--no-async-scheduling", action="store_true", help="wait for each step before the next")
    p.add_argument("--baseline", choices=["none", "transformers"], default="none")
    p.add_argument("--baseline-batch-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64, help="idle: decode batch size (default 64)")
    p.add_argument("--num-steps", type=int, default=50, help="idle: decode steps timed, then profiled (default 50)")


def build_engine(args: argparse.Namespace) -> LLMEngine:
    kwargs: dict[str, Any] = {
        "dtype": args.dtype,
        "quantization": args.quantization,
        "quantize_lm_head": args.quantize_lm_head,
        "kv_cache_dtype": args.kv_cache_dtype,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "enforce_eager": args.enforce_eager,
    }
    if args.no_async_scheduling:
        kwargs["async_scheduling"] = False
    if args.num_blocks is not None:
        kwargs["num_blocks"] = args.num_blocks
    if args.model_shape:
        return LLMEngine(engine_config(SHAPE_PREFIX + args.model_shape, load_format="dummy", **kwargs))
    return LLMEngine(engine_config(args.model or "smollm2-135m", **kwargs))


def limit_ratios(engine: LLMEngine, args: argparse.Namespace, summary: dict[str, float]) -> dict[str, float]:
    """W1: TPOT over the batch-1 decode floor; W2: prefill MFU against the measured matmul peak."""
    if engine.runner.device.type != "cuda":
        return {}
    limits = measure_limits(engine.runner.dtype)
    out = {"copy_bandwidth_gb_s": limits.copy_bandwidth_gb_s, "matmul_tflops": limits.matmul_tflops}
    arch, model = engine.runner.arch, engine.runner.model
    if args.workload == "w1":
        kv_per_token = engine.runner.block_nbytes // engine.info.block_size
        context = (args.input_len or 128) + (args.output_len or 512) // 2
        step_bytes = decode_bytes_per_step(model, kv_per_token, context)
        floor_ms = step_bytes / (limits.copy_bandwidth_gb_s * 1e9) * 1e3
        out |= {
            "decode_bytes_per_step": step_bytes,
            "decode_floor_ms": floor_ms,
            "tpot_over_floor": summary["tpot_ms_p50"] / floor_ms,
        }
    if args.workload == "w2":
        # NOTE: counted from the layers' shapes, not their parameters: packed int4 weights hold 8 per element.
        params = sum(
            m.in_features * m.out_features for n, m in model.named_modules() if isinstance(m, Linear) and n != "lm_head"
        )
        flops = prefill_flops(params, arch.num_layers, arch.num_heads, arch.head_dim, args.input_len or 2048)
        out |= {"prefill_tflops": flops / (summary["ttft_ms_p50"] / 1e3) / 1e12}
        out["prefill_mfu"] = out["prefill_tflops"] / limits.matmul_tflops
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    engine = build_engine(args)
    result: dict[str, Any] = {
        "device": engine.info.device,
        "dtype": engine.info.dtype,
        "quantization": args.quantization,
        "quantize_lm_head": args.quantize_lm_head,
        "kv_cache_dtype": str(engine.runner.kv_dtype).removeprefix("torch."),
        "model": engine.info.model_id,
        "async_scheduling": engine.async_scheduling,
        "cuda_graphs": engine.runner.cuda_graphs is not None,
    }
    if engine.runner.device.type == "cuda":
        result["device_name"] = torch.cuda.get_device_name()
    if args.workload == "idle":
        if engine.runner.device.type != "cuda":
            raise SystemExit("pdserve bench: --workload idle profiles the GPU timeline; it needs CUDA")
        warm_up(engine, engine.info.vocab_size)
        profile = profile_decode(engine, args.batch_size, args.input_len or 512, args.num_steps)
        return {"workload": f"idle decode bs{args.batch_size}"} | result | {"profile": profile}
    workload = make_workload(
        args.workload,
        engine.info.vocab_size,
        args.num_prompts or _DEFAULT_NUM_PROMPTS[args.workload],
        args.input_len,
        args.output_len,
    )
    longest = max(len(r.prompt_token_ids) for r in workload.requests)
    warm_up(engine, engine.info.vocab_size, longest, WARM_UP_REQUESTS)
    summary = run_workload(engine, workload).summary()
    result = {"workload": workload.name} | result | {"engine": summary, "limits": limit_ratios(engine, args, summary)}
    if args.baseline == "transformers":
        hf = hf_model_with_weights(str(engine.model_path), engine.runner.model)
        # NOTE: the baseline holds a copy of the weights; the engine (its KV pool above all) goes first, so that
        # transformers' own KV cache has the memory.
        del engine
        gc.collect()
        torch.cuda.empty_cache()
        batch = 1 if workload.sequential else args.baseline_batch_size
        result["transformers"] = run_transformers(hf, workload, batch)
        result["speedup_vs_transformers"] = summary["output_tok_per_s"] / result["transformers"]["output_tok_per_s"]
    return result
