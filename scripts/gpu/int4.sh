#!/usr/bin/env bash
# GPU int4 (issue 14, GPTQ/AWQ kept packed), in order: the kernel sweep (bench/tune_int4.py: every GEMV/GEMM/dequant
# candidate per 8B projection shape and row bucket, CUDA-graph replays over rotating weights; <= ~150 s), whose table
# is copied into the tree (engine/layers/quant/int4_tuned.json, which the kernels read) and into $OUT; then the
# gpu-marked int4 tests (kernels at the 8B projection shapes; a random Qwen3 in int4 vs bf16 on the same dequantized
# weights), the int4 GEMV micro-benchmark (GB/s vs the bf16 GEMV, on the table's tiles), W1 batch-1 TPOT on the
# Qwen3-8B shape in bf16 and GPTQ int4 (random weights quantized in memory) with the int4 decode floor, and W2
# 2048-token TTFT in int4. Total run time: about 6 minutes on an H100 (step timeouts: 565 s in all).
# Run from the repo root: source scripts/device_env.sh && OUT=/some/folder bash scripts/gpu/int4.sh
# Writes to $OUT three files: summary.txt (what the script prints), int4_tuned.json (the sweep's table: commit it as
# engine/layers/quant/int4_tuned.json) and logs.tgz (every step's log and JSON).
set -u -o pipefail
OUT="${OUT:-/tmp/int4-out}"
LOGS="$(mktemp -d)"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
SHAPE=(--model-shape qwen3-8b --dtype bfloat16 --max-num-seqs 8 --num-blocks 1024)

{
timeout 160 python3 -m bench.tune_int4 --out "$LOGS/int4_tuned.json" --budget-s 110 >"$LOGS/tune_int4.txt" 2>&1
echo "sweep exit $?"
grep -E "^copy|rows (1|2048):|^wrote|budget" "$LOGS/tune_int4.txt"
if [[ -f "$LOGS/int4_tuned.json" ]]; then
    cp "$LOGS/int4_tuned.json" engine/layers/quant/int4_tuned.json
    cp "$LOGS/int4_tuned.json" "$OUT/int4_tuned.json"
fi

timeout 110 python3 -m pytest -q -s -m gpu tests/engine/test_int4_kernels.py tests/engine/test_int4_gpu.py \
    >"$LOGS/int4_tests.txt" 2>&1
echo "tests exit $?"
grep -E "^int4 |passed|failed|error" "$LOGS/int4_tests.txt" | tail -6

timeout 50 python3 -m bench.kernel_gemv_int4 --out "$LOGS" >"$LOGS/gemv_int4.txt" 2>&1
echo "gemv bench exit $?"
grep -E "^[0-9]+x[0-9]+:|^copy" "$LOGS/gemv_int4.txt"

for method in none gptq; do
    timeout 85 python3 -m bench --workload w1 "${SHAPE[@]}" --quantization "$method" --num-prompts 2 \
        --input-len 128 --output-len 256 --json "$LOGS/w1_$method.json" >"$LOGS/w1_$method.log" 2>&1
    echo "w1 $method exit $?"
done
timeout 75 python3 -m bench --workload w2 "${SHAPE[@]}" --quantization gptq --num-prompts 3 --input-len 2048 \
    --json "$LOGS/w2_gptq.json" >"$LOGS/w2_gptq.log" 2>&1
echo "w2 gptq exit $?"

python3 - "$LOGS" <<'PY'
import json, pathlib, sys

out = pathlib.Path(sys.argv[1])


def load(name):
    path = out / name
    return json.loads(path.read_text()) if path.exists() else None


for method in ("none", "gptq"):
    w1 = load(f"w1_{method}.json")
    if w1 is None:
        print(f"W1 {method}: no result (see w1_{method}.log)")
        continue
    limits, tpot = w1["limits"], w1["engine"]["tpot_ms_p50"]
    print(f"W1 bs1 128/256 {method}: TPOT p50 {tpot:.3f} ms; floor = {limits['decode_bytes_per_step'] / 1e9:.3f} GB "
          f"(weights but the embedding, + KV) / {limits['copy_bandwidth_gb_s']:.0f} GB/s = "
          f"{limits['decode_floor_ms']:.3f} ms; TPOT/floor {limits['tpot_over_floor']:.2f}")
w1 = load("w1_gptq.json")
if w1 is not None:
    tpot = w1["engine"]["tpot_ms_p50"]
    print(f"GPTQ int4 TPOT {tpot:.3f} ms: target <= 2.2 ms -> {'MET' if tpot <= 2.2 else 'MISSED'}")
w2 = load("w2_gptq.json")
if w2 is not None:
    print(f"W2 2048 TTFT gptq int4: p50 {w2['engine']['ttft_ms_p50']:.1f} ms, "
          f"{w2['limits'].get('prefill_tflops', float('nan')):.0f} TFLOP/s")
PY
} 2>&1 | tee "$OUT/summary.txt"
tar -czf "$OUT/logs.tgz" -C "$LOGS" .
