"""MoE decode on random weights of a named shape (`python -m bench.offline.moe --model-shape qwen3-30b-a3b
--tensor-parallel-size 2 --enable-expert-parallel`): batch-1 TPOT against its floor, then W4 output throughput at
each concurrency, as one JSON line.

The floor is the bytes a batch-1 step must read (`bench.reporting.limits.active_decode_bytes_per_step`: attention,
router, the 8 routed experts per layer, lm_head, KV; not the 120 idle experts) over the copy bandwidth of all the
GPUs together (ideal: TP splits the attention evenly, but expert parallelism leaves each GPU the experts its tokens
chose). Run once per configuration, each in its own process (so one releases its GPUs before the next starts).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from bench.offline.gpu_profile import profile_decode
from bench.offline.timed_run import run_workload, warm_up
from bench.offline.tp_decode import measure_tpot
from bench.reporting.limits import active_decode_bytes_per_step
from bench.workloads import make_workload
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.models.shapes import SHAPE_PREFIX
from engine.tuning.limits import measure_limits


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-shape", default="qwen3-30b-a3b")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--enable-expert-parallel", action="store_true")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256, help="batch-1 tokens timed")
    parser.add_argument("--concurrency", default="64,256", help="W4 requests submitted at once, comma-separated")
    parser.add_argument("--w4-len", type=int, default=128, help="W4 input and output length")
    parser.add_argument("--num-blocks", type=int, default=4608, help="W4 at 256 x (128 + 128) tokens needs 4096")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument(
        "--profile-steps",
        type=int,
        default=0,
        help="then record this many batch-1 decode steps with the torch profiler (kernels per step, GPU busy and "
        "idle time, the heaviest kernels); TP=1 only (other ranks' GPUs are in other processes)",
    )
    args = parser.parse_args(argv)
    if args.profile_steps and args.tensor_parallel_size > 1:
        parser.error("--profile-steps records this process's GPU: it needs --tensor-parallel-size 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = _args(argv)
    concurrency = [int(c) for c in args.concurrency.split(",") if c]
    # NOTE: measured before the engine takes GPU 0's memory (a 1 GiB copy and two 8192^2 matrices).
    bandwidth_gb_s = measure_limits(torch.bfloat16).copy_bandwidth_gb_s
    torch.cuda.empty_cache()
    engine = LLMEngine(
        engine_config(
            SHAPE_PREFIX + args.model_shape,
            load_format="dummy",
            dtype="bfloat16",
            num_blocks=args.num_blocks,
            max_num_seqs=max([8, *concurrency]),
            tensor_parallel_size=args.tensor_parallel_size,
            enable_expert_parallel=args.enable_expert_parallel,
            enforce_eager=args.enforce_eager,
        )
    )
    arch = engine.executor.arch
    measure_tpot(engine, args.input_len, 16, "warmup")
    gaps = measure_tpot(engine, args.input_len, args.output_len, "timed")
    tpot_ms = 1e3 * statistics.median(gaps)
    step_bytes = active_decode_bytes_per_step(arch, 2, args.input_len + args.output_len // 2)
    floor_ms = step_bytes / (args.tensor_parallel_size * bandwidth_gb_s * 1e9) * 1e3
    result = {
        "model_shape": args.model_shape,
        "device_name": torch.cuda.get_device_name(),
        "tensor_parallel_size": args.tensor_parallel_size,
        "expert_parallel": args.enable_expert_parallel,
        "copy_bandwidth_gb_s": bandwidth_gb_s,
        "active_bytes_per_step": step_bytes,
        "tpot_ms_median": tpot_ms,
        "tpot_floor_ms": floor_ms,
        "tpot_over_floor": tpot_ms / floor_ms,
        "w4": {},
    }
    for c in concurrency:
        workload = make_workload("w4", arch.vocab_size, c, args.w4_len, args.w4_len, seed=c)
        warm_up(engine, arch.vocab_size, args.w4_len, 1)
        summary = run_workload(engine, workload, show_progress=False).summary()
        result["w4"][str(c)] = {k: summary[k] for k in ("output_tok_per_s", "tpot_ms_p50", "ttft_ms_p50", "duration_s")}
    if args.profile_steps:
        result["profile"] = profile_decode(engine, 1, args.input_len, args.profile_steps)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
