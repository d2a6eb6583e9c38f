"""Batch-1 decode TPOT and prefill TTFT of one engine configuration (`python -m bench.offline.tp_decode
--tensor-parallel-size 2`): random weights of a named shape, greedy; as JSON, the time between output tokens after
the first (one prompt of `--input-len`), and the time from adding a prompt of `--ttft-input-len` tokens to its first
token (the median of `--ttft-runs`, after one untimed run).

Run once per configuration, each in its own process (so one releases its GPUs before the next starts);
scripts/gpu/tp.sh compares TP=2 with TP=1 this way.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time

from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine


def measure_tpot(engine: LLMEngine, input_len: int, output_len: int, req_id: str) -> list[float]:
    """Seconds between consecutive output tokens of one greedy request (the first token excluded)."""
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    engine.add_request(req_id, [(7 * i) % 1000 + 1 for i in range(input_len)], params)
    stamps: list[float] = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            stamps += [time.perf_counter()] * len(output.new_token_ids)
    return [b - a for a, b in itertools.pairwise(stamps[1:])]


def measure_ttft(engine: LLMEngine, input_len: int, run: int) -> tuple[float, float]:
    """Seconds from adding a prompt of `input_len` tokens to its first token, and of that the first engine step
    (with one device: scheduling and enqueueing the whole prefill, the host's share of it); `run` makes the prompt's
    first token differ from every other run's, so nothing of it is in the prefix cache."""
    engine.step()  # NOTE: the step still in flight after the last run's token (async scheduling) ends here
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    prompt = [1001 + run] + [(11 * i) % 1000 + 1 for i in range(1, input_len)]
    start = time.perf_counter()
    engine.add_request(f"ttft-{run}", prompt, params)
    engine.step()
    first_step = time.perf_counter() - start
    while engine.has_unfinished_requests():
        engine.step()
    return time.perf_counter() - start, first_step


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-shape", default="qwen3-8b")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--num-blocks", type=int, default=1024)
    parser.add_argument("--ttft-input-len", type=int, default=2048)
    parser.add_argument("--ttft-runs", type=int, default=5)
    parser.add_argument("--all-reduce", default="auto", help="TP all-reduce: auto (peer memory, NCCL) or nccl")
    args = parser.parse_args(argv)
    config = engine_config(
        f"shape:{args.model_shape}",
        load_format="dummy",
        dtype="bfloat16",
        num_blocks=args.num_blocks,
        max_num_seqs=8,
        tensor_parallel_size=args.tensor_parallel_size,
        all_reduce=args.all_reduce,
    )
    engine = LLMEngine(config)
    measure_tpot(engine, args.input_len, 16, "warmup")
    gaps = measure_tpot(engine, args.input_len, args.output_len, "timed")
    ttfts, first_steps = zip(
        *[measure_ttft(engine, args.ttft_input_len, run) for run in range(args.ttft_runs + 1)][1:], strict=True
    )
    print(
        json.dumps(
            {
                "model_shape": args.model_shape,
                "tensor_parallel_size": args.tensor_parallel_size,
                "all_reduce": args.all_reduce,
                "tpot_ms_median": 1e3 * statistics.median(gaps),
                "tpot_ms_mean": 1e3 * statistics.fmean(gaps),
                "num_tokens": len(gaps) + 1,
                "ttft_input_len": args.ttft_input_len,
                "ttft_ms_median": 1e3 * statistics.median(ttfts),
                "ttft_ms_all": [round(1e3 * t, 3) for t in ttfts],
                "ttft_first_step_ms_all": [round(1e3 * t, 3) for t in first_steps],
            }
        )
    )


if __name__ == "__main__":
    main()
