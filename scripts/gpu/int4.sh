#!/usr/bin/env bash
# GPU int4 (issue 14, GPTQ/AWQ kept packed), in order: the kernel sweep (engine/layers/quant/tune_int4.py: every
# GEMV/GEMM/dequant candidate per 8B projection shape and row bucket, each output checked before it is timed, CUDA-graph
# replays over rotating weights; <= ~150 s), whose table is copied into the tree (engine/layers/quant/int4_tuned.json,
# which the kernels read) and into $OUT; then the gpu-marked int4 tests (kernels at the 8B projection shapes; a random
# Qwen3 in int4 vs bf16 on the same dequantized weights), the int4 GEMV micro-benchmark (GB/s vs the bf16 GEMV, on the
# table's tiles), W1 batch-1 TPOT on the Qwen3-8B shape in bf16 and GPTQ int4 (random weights quantized in memory) with
# the int4 decode floor, and W2 2048-token TTFT in int4. Total run time: about 6 minutes on an H100 (steps share
# BUDGET_S, default 560 s).
# Run from the repo root: source scripts/device_env.sh && OUT=/some/folder bash scripts/gpu/int4.sh
# Writes to $OUT three files: summary.txt (each step's exit code and time, then what the steps printed),
# int4_tuned.json (the sweep's table: commit it as engine/layers/quant/int4_tuned.json) and logs.tar.gz (every step's
# log and JSON).
set -u -o pipefail
BUDGET_S=${BUDGET_S:-560}
source "$(dirname "$0")/lib.sh"
SHAPE=(--model-shape qwen3-8b --dtype bfloat16 --max-num-seqs 8 --num-blocks 1024)

step tune_int4 160 python3 -m engine.layers.quant.tune_int4 --out "$LOGS/int4_tuned.json" --budget-s 110
grep -E "^copy|rows (1|2048):|^wrote|budget" "$LOGS/tune_int4.log" >>"$SUMMARY"
if [[ -f "$LOGS/int4_tuned.json" ]]; then
    cp "$LOGS/int4_tuned.json" engine/layers/quant/int4_tuned.json
    cp "$LOGS/int4_tuned.json" "$OUT/int4_tuned.json"
fi
step int4_tests 110 python3 -m pytest -q -s -m gpu -o addopts="" -p no:cacheprovider -rA \
    tests/engine/test_int4_kernels.py tests/engine/test_int4_gpu.py
step gemv_int4 50 python3 -m bench.kernels.gemv_int4 --out "$LOGS"
grep -E "^[0-9]+x[0-9]+:|^copy" "$LOGS/gemv_int4.log" >>"$SUMMARY"
for method in none gptq; do
    step "w1_$method" 85 python3 -m bench --workload w1 "${SHAPE[@]}" --quantization "$method" --num-prompts 2 \
        --input-len 128 --output-len 256 --json "$LOGS/w1_$method.json"
done
step w2_gptq 75 python3 -m bench --workload w2 "${SHAPE[@]}" --quantization gptq --num-prompts 3 --input-len 2048 \
    --json "$LOGS/w2_gptq.json"
python3 -m bench.reporting.gpu_summary "$LOGS" tests=int4_tests w1=none,gptq w2=gptq >>"$SUMMARY" 2>&1
echo "total: $((SECONDS - START))s" >>"$SUMMARY"
cat "$SUMMARY"
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOGS"
