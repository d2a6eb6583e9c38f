#!/usr/bin/env bash
# The lm_head in FP8 (`--quantize-lm-head`) on one GPU (H100/H200): the fp8 GEMV's tiles for the Qwen3-8B lm_head
# (151936x4096: bench/kernels/fp8_gemv.py --shapes lm_head --write-table, the sweep of engine/layers/tune_fp8_gemv.py,
# into engine/layers/fp8_gemv_tiles.json), the fp8 GPU tests with that table (the fp8 + fp8-head logits bound among
# them), then W1 batch-1 TPOT (Qwen3-8B shape, random weights, 128 in / 256 out) in bf16, fp8, and fp8 with the
# lm_head in fp8, in one run.
#
#   source scripts/device_env.sh && OUT=$OUT/head bash scripts/gpu/fp8_head.sh     (repo root; at most ~7 minutes)
#
# Writes summary.txt, tables.tar.gz (the GEMV table at its repo path) and logs.tar.gz to $OUT.
set -u -o pipefail
BUDGET_S=${BUDGET_S:-420}
source "$(dirname "$0")/lib.sh"

W8B=(--model-shape qwen3-8b --max-num-seqs 8 --num-blocks 1024 --num-prompts 2 --input-len 128 --output-len 256)
step gemv_lm_head 150 python3 -m bench.kernels.fp8_gemv --out "$LOGS" --shapes lm_head --write-table
step gpu_tests 120 python3 -m pytest -q -s -m gpu -o addopts="" -p no:cacheprovider -rA tests/engine/test_fp8_gpu.py
step w1_none 45 python3 -m bench --workload w1 "${W8B[@]}" --quantization none --json "$LOGS/w1_none.json"
step w1_fp8 45 python3 -m bench --workload w1 "${W8B[@]}" --quantization fp8 --json "$LOGS/w1_fp8.json"
step w1_fp8_head 45 python3 -m bench --workload w1 "${W8B[@]}" --quantization fp8 --quantize-lm-head \
    --json "$LOGS/w1_fp8_head.json"
python3 -m bench.reporting.gpu_summary "$LOGS" tests=gpu_tests w1=none,fp8,fp8_head fp8_gemv >>"$SUMMARY" 2>&1
echo "total: $((SECONDS - START))s" | tee -a "$SUMMARY"
tar -czf "$OUT/tables.tar.gz" engine/layers/fp8_gemv_tiles.json
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOGS"
