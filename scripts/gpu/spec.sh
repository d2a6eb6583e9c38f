#!/usr/bin/env bash
# Speculative decoding on the GPU (issue 13): the gpu-marked spec and engine tests, then batch-1 decode on the Qwen3-8B shape
# (random bf16 weights, CUDA graphs on) with the replay proposer at 0%, 30% and 100% corruption (k=4) vs off, and
# batch 64 on vs off. Total run time: about 5 minutes on an H100.
# Run from the repo root: source scripts/device_env.sh && bash scripts/gpu/spec.sh
# Writes $OUT/spec_tests.txt and $OUT/spec_timing.json; prints one line per case.
set -euo pipefail
OUT="${OUT:-/tmp/spec-out}"
mkdir -p "$OUT"
# NOTE: test_gpu_engine.py too: the decode graphs now share their capture code with the verify graphs.
python3 -m pytest -q -m gpu -o addopts="" -p no:cacheprovider tests/engine/spec/test_spec_gpu.py \
  tests/engine/test_gpu_engine.py > "$OUT/spec_tests.txt" 2>&1 || echo "GPU TESTS FAILED (see spec_tests.txt)"
tail -3 "$OUT/spec_tests.txt"
python3 - "$OUT/spec_timing.json" <<'PY'
import json, random, sys, time

import torch

from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine

SHAPE = dict(model="shape:qwen3-8b", load_format="dummy", dtype="bfloat16", num_blocks=2048, max_model_len=2048)
rng = random.Random(0)
PROMPT = [rng.randrange(1000, 100000) for _ in range(128)]
BATCH = [[rng.randrange(1000, 100000) for _ in range(128)] for _ in range(64)]


def decode(engine, prompts, max_tokens):
    """Each request's output tokens and the run's (TPOT s after the first token, output tok/s)."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    tokens = {str(i): [] for i in range(len(prompts))}
    first = None
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        for o in engine.step():
            tokens[o.req_id] += o.new_token_ids
        if first is None and any(tokens.values()):
            first = time.perf_counter()
    torch.cuda.synchronize()
    end = time.perf_counter()
    n = sum(len(t) for t in tokens.values())
    return [tokens[str(i)] for i in range(len(prompts))], (end - first) / (max_tokens - 1), n / (end - start)


def timed(engine, prompts, max_tokens):
    decode(engine, prompts, 32)  # warm-up
    return decode(engine, prompts, max_tokens)


results = {}
off = LLMEngine(engine_config(**SHAPE))
(recorded,), tpot_off, _ = timed(off, [PROMPT], 256)
batch_out, _, tput_off = timed(off, BATCH, 128)
results["off"] = {"tpot_ms": tpot_off * 1e3, "batch64_tok_s": tput_off}
print(f"off: batch-1 TPOT {tpot_off * 1e3:.2f} ms, batch-64 {tput_off:.0f} tok/s", flush=True)
del off
torch.cuda.empty_cache()
for corruption in (0.0, 0.3, 1.0):
    spec = {"method": "replay", "replay_corruption": corruption, "num_speculative_tokens": 4}
    on = LLMEngine(engine_config(**SHAPE, speculative_config=spec))
    recordings = {tuple(PROMPT): recorded, **{tuple(p): o for p, o in zip(BATCH, batch_out)}}
    on.set_replay_recordings(recordings)
    (tokens,), tpot, _ = timed(on, [PROMPT], 256)
    stats = on.spec_stats
    row = {"tpot_ms": tpot * 1e3, "ratio": tpot / tpot_off, "same_tokens": tokens == recorded,
           "acceptance_rate": stats.acceptance_rate, "mean_accepted_length": stats.mean_accepted_length}
    if corruption == 0.0:
        _, _, tput = timed(on, BATCH, 128)
        row["batch64_ratio"] = tput / tput_off
    results[f"replay_corruption_{corruption}"] = row
    print(f"corruption {corruption}: {json.dumps(row)}", flush=True)
    del on
    torch.cuda.empty_cache()
json.dump(results, open(sys.argv[1], "w"), indent=2)
PY
