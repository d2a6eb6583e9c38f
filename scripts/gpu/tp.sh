#!/usr/bin/env bash
# Tensor/pipeline parallel on a 2-GPU machine (nvidia-h200-x2; issue 15, acceptance 2). About 5 minutes:
#   1. tests/engine/parallel/test_parallel_gpu.py: TP=2 (eager and CUDA graphs) and PP=2 engines in float32,
#      greedy-identical to one GPU on tiny Llama and Qwen3 (6 cases)              -> $OUT/gpu_tests.txt
#   2. batch-1 decode TPOT, Qwen3-8B shape, bf16 random weights, 128-token prompt, 256 tokens: TP=1 on GPU 0,
#      then TP=2 on GPUs 0-1, each in its own process                            -> $OUT/tpot_tp{1,2}.json
#   3. the ratio TP=2 / TP=1 of the median TPOT (acceptance: <= 0.6)            -> $OUT/summary.txt
# W6 across a TP=2 pod pair (and the parallel pods' GPU tests): scripts/gpu/tppods.sh.
# Usage (device repo root): source scripts/device_env.sh && bash scripts/gpu/tp.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,memory.total --format=csv >"$OUT/gpus.txt" 2>&1
timeout 180 python3 -m pytest -q -m gpu -o addopts="" -p no:cacheprovider tests/engine/parallel/test_parallel_gpu.py \
  2>&1 | tail -15 >"$OUT/gpu_tests.txt"
for tp in 1 2; do
  timeout 150 python3 -m bench.offline.tp_decode --tensor-parallel-size "$tp" 2>"$OUT/tpot_tp$tp.log" | tail -1 >"$OUT/tpot_tp$tp.json"
done
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
tpot = {tp: json.loads((out / f"tpot_tp{tp}.json").read_text() or "{}").get("tpot_ms_median") for tp in (1, 2)}
print(f"tpot_ms_median TP=1 {tpot[1]}  TP=2 {tpot[2]}")
if tpot[1] and tpot[2]:
    ratio = tpot[2] / tpot[1]
    print(f"TP=2/TP=1 = {ratio:.3f} ({'PASS' if ratio <= 0.6 else 'FAIL'}: acceptance <= 0.6)")
print((out / "gpu_tests.txt").read_text().strip().splitlines()[-1])
PY
