#!/usr/bin/env bash
# Batch-1 GEMV for GPTQ int4 and FP8 (issue 14) on one GPU (H100/H200), in order:
# 1. the int4 sweep at 1 row (engine/layers/quant/tune_int4.py --buckets 1: every GEMV tile x split-K in packed
#    half precision (HALF2), the float32 GEMV on its former winners; each candidate's output checked against float32
#    before it is timed), its table copied into the tree (engine/layers/quant/int4_tuned.json; the other buckets'
#    entries kept);
# 2. the fp8 GEMV sweep (bench/kernels/fp8_gemv.py --write-table, the sweep of engine/layers/tune_fp8_gemv.py:
#    tiles per projection, each checked before it is timed, into engine/layers/fp8_gemv_tiles.json; also the bf16
#    GEMV per projection and the 2048-row fp8 path);
# 3. the GPU tests of both (int4 kernels at the 8B shapes incl. HALF2 in bf16/fp16, a random Qwen3 in int4 vs bf16;
#    the fp8 GEMV at the 8B shapes and fp8 prompt logits vs bf16), on the new tables;
# 4. W1 batch-1 TPOT on the Qwen3-8B shape (random weights, 128 in / 256 out) in GPTQ int4, fp8 and bf16.
#
#   source scripts/device_env.sh && OUT=$OUT/gemv bash scripts/gpu/gemv.sh     (repo root; at most ~7 minutes)
#
# Steps share BUDGET_S seconds (default 405; a step never runs past what is left). Writes exactly three files to
# $OUT: summary.txt (each step's exit code and time, the tests' verdicts, W1 against the targets, the GEMV per
# projection as % of copy bandwidth for bf16 / fp8 / int4), tables.tar.gz (both tuned tables at their repo paths:
# `tar -xzf` in the repo root) and logs.tar.gz (every step's log and JSON, the commands).
set -u -o pipefail
BUDGET_S=${BUDGET_S:-405}
source "$(dirname "$0")/lib.sh"
W8B=(--model-shape qwen3-8b --dtype bfloat16 --max-num-seqs 8 --num-blocks 1024)

step tune_int4 120 python3 -m engine.layers.quant.tune_int4 --out "$LOGS/int4_tuned.json" --budget-s 70 --buckets 1
grep -E "^copy|rows 1:|^wrote|budget" "$LOGS/tune_int4.log" >>"$SUMMARY"
[[ -f "$LOGS/int4_tuned.json" ]] && cp "$LOGS/int4_tuned.json" engine/layers/quant/int4_tuned.json
step gemv_fp8 90 python3 -m bench.kernels.fp8_gemv --out "$LOGS" --write-table
step gpu_tests 80 python3 -m pytest -q -s -m gpu -o addopts="" -p no:cacheprovider -rA \
    tests/engine/test_int4_kernels.py tests/engine/test_int4_gpu.py tests/engine/test_fp8_gpu.py -k "int4 or gemv or logits"
# NOTE: gptq first (its random weights are quantized in memory: the slowest start), bf16 last (the baseline, 6.01 ms
# in every run so far): if the budget runs short, the baseline is what goes.
declare -A W1_LIMIT_S=([gptq]=75 [fp8]=55 [none]=55)
for method in gptq fp8 none; do
    step "w1_$method" "${W1_LIMIT_S[$method]}" python3 -m bench --workload w1 "${W8B[@]}" --quantization "$method" \
        --num-prompts 2 --input-len 128 --output-len 256 --json "$LOGS/w1_$method.json"
done
python3 -m bench.reporting.gpu_summary "$LOGS" tests=gpu_tests w1=none,fp8,gptq gemv fp8_gemv >>"$SUMMARY" 2>&1
echo "total: $((SECONDS - START))s" | tee -a "$SUMMARY"
tar -czf "$OUT/tables.tar.gz" engine/layers/quant/int4_tuned.json engine/layers/fp8_gemv_tiles.json
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOGS"
