#!/usr/bin/env bash
# The tp branch merged with speculation, fp8 and int4, on a 2-GPU machine (nvidia-h200-x2). At most ~6 minutes:
#   1. tests/engine/parallel/test_parallel_gpu.py: TP=2 (eager, CUDA graphs) and PP=2 greedy-identical to one GPU in
#      float32 on tiny Llama and Qwen3 (6 cases), and TP=2 with kv_cache_dtype fp8 (bf16): each rank's pool fp8
#      with its one KV head, greedy common-prefix agreement with one GPU >= 0.5 (1 case)  -> $OUT/parallel.txt
#   2. one GPU, the runner's moved CUDA graph capture: tests/engine/spec/test_spec_gpu.py (verify graphs) and the
#      fp8 engine-level logits test of tests/engine/test_fp8_gpu.py (decode graphs on, fp8 KV)   -> $OUT/single.txt
#   3. $OUT/summary.txt: each step's last pytest line and the printed fp8-KV agreement figure.
# Acceptance: "7 passed" in step 1 and "3 passed" in step 2 (no failures, no skips on 2 GPUs).
# Usage (device repo root): source scripts/device_env.sh && bash scripts/gpu/tpmerge.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT to the folder for the results}
PYTEST=(python3 -m pytest -q -s -m gpu -o addopts="" -p no:cacheprovider)
nvidia-smi --query-gpu=index,name,memory.total --format=csv >"$OUT/gpus.txt" 2>&1
timeout 240 "${PYTEST[@]}" tests/engine/parallel/test_parallel_gpu.py >"$OUT/parallel.txt" 2>&1
timeout 100 "${PYTEST[@]}" tests/engine/spec/test_spec_gpu.py tests/engine/test_fp8_gpu.py -k "spec or logits" \
  >"$OUT/single.txt" 2>&1
{
  cat "$OUT/gpus.txt"
  echo "step 1: $(tail -1 "$OUT/parallel.txt")"
  grep -h "common-prefix agreement" "$OUT/parallel.txt"
  echo "step 2: $(tail -1 "$OUT/single.txt")"
} | tee "$OUT/summary.txt"
