#!/usr/bin/env bash
# W10 on the GPU (issue 13): decode with speculation on vs off on the Qwen3-8B shape (random bf16 weights, CUDA
# graphs on), replay proposer at acceptance 1.0/0.75/0.5/0.25/0.0, k=4, batch 1, 16 and 64 (128 prompt tokens,
# 256 output tokens, EOS ignored). Total run time: about 4 minutes on an H100 (two 8B engines built, 18 timed runs).
# Run from the repo root: source scripts/device_env.sh && OUT=... bash scripts/gpu/w10.sh
# Writes $OUT/w10.json (bench.w10's rows) and $OUT/w10.log; prints one table line per row, then the acceptance
# checks of issue 13 (batch 1: ratio <= 0.35 at acceptance 1.0 and <= 1.05 at 0.0; batch 64: throughput >= 0.97x),
# and the step times that `--workload w10 --spec-tasks ... --step-ms DECODE,VERIFY` takes.
set -euo pipefail
OUT="${OUT:?set OUT to the folder for the results}"
mkdir -p "$OUT"
timeout 290 python3 -m bench --workload w10 --model-shape qwen3-8b --dtype bfloat16 --batch-sizes 1,16,64 \
  --spec-acceptance 1.0,0.75,0.5,0.25,0.0 --spec-k 4 --input-len 128 --output-len 256 \
  --json "$OUT/w10.json" >"$OUT/w10.log" 2>&1 || { tail -30 "$OUT/w10.log"; exit 1; }
python3 - "$OUT/w10.json" <<'PY'
import json
import sys

result = json.load(open(sys.argv[1]))
print(f"{result['device_name']} {result['model']} {result['dtype']} cuda_graphs={result['cuda_graphs']}")
print("batch  k  accept  tpot_off_ms  tpot_on_ms  ratio  tok/s_ratio  acc_rate  mean_acc_len  step_on_ms  same")
rows = {(r["batch"], r["acceptance"]): r for r in result["rows"]}
for r in result["rows"]:
    print(f"{r['batch']:5d} {r['k']:2d} {r['acceptance']:7.2f} {r['tpot_off_ms']:12.2f} {r['tpot_on_ms']:11.2f} "
          f"{r['tpot_ratio']:6.3f} {r['throughput_ratio']:12.3f} {r['acceptance_rate']:9.3f} "
          f"{r['mean_accepted_length']:13.2f} {r['step_on_ms']:11.2f}  {r['same_tokens']}")
checks = [
    ("batch 1, acceptance 1.0: TPOT ratio <= 0.35", rows[1, 1.0]["tpot_ratio"] <= 0.35),
    ("batch 1, acceptance 0.0: TPOT ratio <= 1.05", rows[1, 0.0]["tpot_ratio"] <= 1.05),
    ("batch 64, acceptance 1.0: throughput ratio >= 0.97", rows[64, 1.0]["throughput_ratio"] >= 0.97),
    ("every row: the recorded greedy tokens", all(r["same_tokens"] for r in result["rows"])),
]
for name, ok in checks:
    print(f"{'PASS' if ok else 'FAIL'} {name}")
print(f"--step-ms {rows[1, 1.0]['tpot_off_ms']:.3f},{rows[1, 1.0]['step_on_ms']:.3f}  "
      "(batch-1 decode step off, verify step at k+1=5 tokens)")
PY
