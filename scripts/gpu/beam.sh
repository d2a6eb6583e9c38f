#!/usr/bin/env bash
# Beam search on the GPU (issue 31): the gpu-marked beam test (transformers' beams on the same GPU in float32, with CUDA
# graphs and async scheduling, block copies on the device), then beam width 4 on the Qwen3-0.6B shape (random bf16
# weights, 128 prompt + 128 output tokens): the step time per beam vs greedy batch 4, and the blocks the beams hold.
# Run from the repo root: source scripts/device_env.sh && OUT=... bash scripts/gpu/beam.sh
set -euo pipefail
OUT="${OUT:-/tmp/beam-out}"
mkdir -p "$OUT/beam"
python3 -m pytest -q -m gpu -o addopts="" -p no:cacheprovider tests/engine/beam/test_beam_gpu.py \
  > "$OUT/beam/tests.txt" 2>&1 || echo "GPU TESTS FAILED (see beam/tests.txt)"
tail -3 "$OUT/beam/tests.txt"
timeout 280 python3 - "$OUT/beam/results.json" <<'PY'
import json, random, sys, time

from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine

engine = LLMEngine(
    engine_config("shape:qwen3-0.6b", load_format="dummy", dtype="bfloat16", num_blocks=2048, max_model_len=1024)
)
rng = random.Random(0)
prompt = [rng.randrange(1000, 100000) for _ in range(128)]
# NOTE: a warm-up first (Triton kernels compile on their first shapes), so neither timed run pays for it.
engine.add_request("warm-up", prompt, SamplingParams(n=4, temperature=0.0, max_tokens=16, use_beam_search=True))
engine.add_request("warm-up-greedy", prompt, SamplingParams(temperature=0.0, max_tokens=16))
while engine.has_unfinished_requests():
    engine.step()
results = {}
for name, params, copies in (
    ("greedy x4", SamplingParams(n=1, temperature=0.0, max_tokens=128, ignore_eos=True), 4),
    ("beam width 4", SamplingParams(n=4, temperature=0.0, max_tokens=128, ignore_eos=True, use_beam_search=True), 1),
):
    for i in range(copies):
        engine.add_request(f"{name}-{i}", prompt, params)
    num_steps, peak_blocks = 0, 0
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        num_steps += 1
        peak_blocks = max(peak_blocks, 2048 - engine.kv_cache_manager.num_free_blocks)
    elapsed = time.perf_counter() - start
    results[name] = {"s": elapsed, "steps": num_steps, "ms_per_step": 1e3 * elapsed / num_steps, "peak_blocks": peak_blocks}
    print(name, results[name])
json.dump(results, open(sys.argv[1], "w"), indent=1)
PY
