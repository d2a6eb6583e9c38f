"""Per-kernel profile of batch-1 decode steps with the small-kernel knobs of issue 14 (W1) off and on, in one process.

python3 -m bench.decode_step_ab --quantization gptq --json OUT.json   (GPU; Qwen3-8B shape, random weights)

Variants, in order (each swaps the tables the launchers read, then captures the decode CUDA graphs again):
- `pdl`: the device-side split rule (one partition per MIN_SPLIT_TOKENS tokens: short contexts skip the reduce) and
  PDL launches of RMSNorm, q/k norm + RoPE + store, decode attention and its reduce;
- `nosplit`: the rule alone;
- `main`: every partition the host's split bound allows (min_split_tokens 1) and no PDL on the small kernels: the
  kernels as they ran before these knobs.
Each variant profiles steady decode at batch 1 and each context (bench.gpu_profile.profile_decode): wall time per
step (unrecorded steps), GPU busy and idle time, kernels per step and the heaviest kernels; records greedy ids of
two requests (`nosplit` and `pdl` run the same arithmetic: their ids must be equal); then it runs W1 as
`python3 -m bench --workload w1 --num-prompts 2 --input-len 128 --output-len 256` does (same engine settings as
scripts/gpu/gemv.sh). `--w1-json` gets the first variant's W1 result in that command's format; `--json` all results,
rewritten after each variant. The committed tables are left as they are; the variants' tables are written to a
temporary folder.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from bench.gpu_profile import profile_decode
from bench.offline import run_workload, warm_up
from bench.offline_cli import limit_ratios
from bench.workloads import make_workload
from common.sampling_params import SamplingParams
from engine.attention import decode_tuning
from engine.attention.decode_tuning import MIN_SPLIT_TOKENS
from engine.attention.triton_decode import DecodeTiles
from engine.layers import pdl
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.models.shapes import SHAPE_PREFIX

VARIANTS = {"pdl": (MIN_SPLIT_TOKENS, True), "nosplit": (MIN_SPLIT_TOKENS, False), "main": (1, False)}
KV_DTYPES = ("bfloat16", "float16", "float32")
GREEDY_PROMPT_LENS = (100, 1500)


def write_variant_tables(folder: Path, min_split_tokens: int, pdl_on: bool) -> tuple[Path, Path]:
    """The decode tuning table (the committed entries, plus the default tiles for the model dtypes, each with this
    min_split_tokens) and the PDL table of a variant, written into folder."""
    tuning = json.loads(decode_tuning.TABLE_PATH.read_text())
    default = {**asdict(DecodeTiles()), "programs_per_sm": decode_tuning.PROGRAMS_PER_SM}
    for name in KV_DTYPES:
        tuning.setdefault(name, dict(default))
    for entry in tuning.values():
        entry["min_split_tokens"] = min_split_tokens
    tuning_path, pdl_path = folder / "decode_tuning.json", folder / "pdl_launches.json"
    tuning_path.write_text(json.dumps(tuning))
    pdl_path.write_text(json.dumps(dict.fromkeys(json.loads(pdl.TABLE_PATH.read_text()), pdl_on)))
    return tuning_path, pdl_path


def use_tables(engine: LLMEngine, tuning_path: Path, pdl_path: Path) -> None:
    """Launchers read these tables from now on, and the decode graphs are captured again with them."""
    # NOTE: a benchmark's switch: the modules read their table paths at call time and cache the result.
    decode_tuning.TABLE_PATH = tuning_path
    pdl.TABLE_PATH = pdl_path
    decode_tuning.decode_launch.cache_clear()
    pdl.pdl_launches.cache_clear()
    runner = engine.runner
    runner.cuda_graphs = None
    gc.collect()
    torch.cuda.empty_cache()
    runner.cuda_graphs = runner._capture_cuda_graphs(engine.config)


def greedy_tokens(engine: LLMEngine, prompt_lens: tuple[int, ...], num_tokens: int) -> list[list[int]]:
    """Greedy output ids of one request per prompt length, one at a time (their contexts cross the split rule's
    thresholds): a race between PDL kernels shows as ids that differ from the same numerics without PDL."""
    vocab, params = engine.info.vocab_size, SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
    tokens: list[list[int]] = []
    for index, prompt_len in enumerate(prompt_lens):
        engine.add_request(f"greedy-{index}", [(j * 7919 + index) % vocab for j in range(prompt_len)], params)
        ids: list[int] = []
        while engine.has_unfinished_requests():
            ids += [t for out in engine.step() for t in out.new_token_ids]
        tokens.append(ids)
    return tokens


def run_w1(engine: LLMEngine, input_len: int, output_len: int) -> dict[str, Any]:
    """W1 (two prompts, one at a time) as `bench --workload w1` runs it."""
    workload = make_workload("w1", engine.info.vocab_size, 2, input_len, output_len)
    return {"workload": workload.name, "engine": run_workload(engine, workload, show_progress=False).summary()}


def w1_limits(engine: LLMEngine, input_len: int, output_len: int, summary: dict[str, float]) -> dict[str, float]:
    """The decode floor and TPOT over it, as `bench --workload w1` reports them."""
    return limit_ratios(engine, argparse.Namespace(workload="w1", input_len=input_len, output_len=output_len), summary)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quantization", default="none", help="none, fp8 or gptq (the engine's field)")
    parser.add_argument("--model-shape", default="qwen3-8b")
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 2048])
    parser.add_argument("--num-steps", type=int, default=20)
    parser.add_argument("--input-len", type=int, default=128, help="W1 prompt tokens")
    parser.add_argument("--output-len", type=int, default=256, help="W1 output tokens")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--w1-json", type=Path, default=None, help="the last variant's W1 result")
    args = parser.parse_args()
    engine = LLMEngine(engine_config(SHAPE_PREFIX + args.model_shape, load_format="dummy", dtype="bfloat16",
                                     quantization=args.quantization, max_num_seqs=8, num_blocks=1024))  # fmt: skip
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(), "quantization": args.quantization}
    warm_up(engine, engine.info.vocab_size)
    # NOTE: once before the variants, so that each finds the same prompt blocks in the prefix cache (same arithmetic).
    greedy_tokens(engine, GREEDY_PROMPT_LENS, 1)
    with tempfile.TemporaryDirectory() as tmp:
        for variant, (min_split_tokens, pdl_on) in VARIANTS.items():
            folder = Path(tmp) / variant
            folder.mkdir()
            use_tables(engine, *write_variant_tables(folder, min_split_tokens, pdl_on))
            for context in args.contexts:
                profile = profile_decode(engine, 1, context, args.num_steps)
                results[f"{variant} ctx{context}"] = profile
                wall, idle = profile["wall_us_per_step"], profile["gpu_idle_fraction"]
                print(f"{args.quantization} {variant} ctx{context}: {wall:.0f} us/step, idle {idle:.1%}", flush=True)
            results[f"{variant} greedy"] = greedy_tokens(engine, GREEDY_PROMPT_LENS, 48)
            w1 = run_w1(engine, args.input_len, args.output_len)
            results[f"{variant} w1"] = w1["engine"]
            print(f"{args.quantization} {variant} W1 TPOT p50 {w1['engine']['tpot_ms_p50']:.3f} ms", flush=True)
            if args.w1_json is not None and variant == next(iter(VARIANTS)):
                w1["limits"] = w1_limits(engine, args.input_len, args.output_len, w1["engine"])
                args.w1_json.write_text(json.dumps({"variant": variant, "device": results["device"]} | w1, indent=1))
            args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
