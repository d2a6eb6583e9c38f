#!/usr/bin/env bash
# W10 on the GPU (issue 13): decode with speculation on vs off on the Qwen3-8B shape (random bf16 weights, CUDA
# graphs on), replay proposer at acceptance 1.0/0.75/0.5/0.25/0.0, k=4, batch 1, 16 and 64 (128 prompt tokens,
# 128 output tokens, EOS ignored). Each acceptance level replays the speculating engine's own greedy output until it
# reproduces it (bench/offline/w10.py, engine.spec.replay.replay_until_reproduced; at most 16 rounds), the last round timed.
# Batch 64 never proposes (disable_by_batch_size 32): its rows take one round of plain decode steps (~1 s each).
# Total run time: about 3 minutes on an H100, at most 5 (two 8B engines built; the bench is cut at 270 s).
# Run from the repo root: source scripts/device_env.sh && OUT=... bash scripts/gpu/w10.sh
# Writes $OUT/w10.json (bench.offline.w10's rows), $OUT/w10.log and $OUT/w10.svg (scripts/plot_spec_curve.py: TPOT ratio
# vs acceptance, batch 1 and 16, with the bounds); prints one table line per row, then the acceptance checks of
# issue 13 (batch 1: ratio <= 0.35 at acceptance 1.0 and <= 1.05 at 0.0; batch 64: throughput >= 0.97x; every
# row's timed round on its recording), and the step times that `--workload w10 --spec-tasks ... --step-ms` takes.
set -euo pipefail
OUT="${OUT:?set OUT to the folder for the results}"
mkdir -p "$OUT"
timeout 270 python3 -m bench --workload w10 --model-shape qwen3-8b --dtype bfloat16 --batch-sizes 1,16,64 \
  --spec-acceptance 1.0,0.75,0.5,0.25,0.0 --spec-k 4 --input-len 128 --output-len 128 \
  --json "$OUT/w10.json" >"$OUT/w10.log" 2>&1 || { tail -30 "$OUT/w10.log"; exit 1; }
python3 scripts/plot_spec_curve.py "$OUT/w10.json" "$OUT/w10.svg" --note "scripts/gpu/w10.sh, $(date -u +%F)"
python3 - "$OUT/w10.json" <<'PY'
import json
import sys

result = json.load(open(sys.argv[1]))
print(f"{result['device_name']} {result['model']} {result['dtype']} cuda_graphs={result['cuda_graphs']}")
print("batch  k  accept  tpot_off_ms  tpot_on_ms  ratio  tok/s_ratio  acc_rate  mean_acc_len  step_on_ms  rounds  same")
rows = {(r["batch"], r["acceptance"]): r for r in result["rows"]}
for r in result["rows"]:
    print(f"{r['batch']:5d} {r['k']:2d} {r['acceptance']:7.2f} {r['tpot_off_ms']:12.2f} {r['tpot_on_ms']:11.2f} "
          f"{r['tpot_ratio']:6.3f} {r['throughput_ratio']:12.3f} {r['acceptance_rate']:9.3f} "
          f"{r['mean_accepted_length']:13.2f} {r['step_on_ms']:11.2f} {r['rounds']:7d}  {r['same_tokens']}")
checks = [
    ("batch 1, acceptance 1.0: TPOT ratio <= 0.35", rows[1, 1.0]["tpot_ratio"] <= 0.35),
    ("batch 1, acceptance 0.0: TPOT ratio <= 1.05", rows[1, 0.0]["tpot_ratio"] <= 1.05),
    ("batch 64, acceptance 1.0 and 0.0: throughput ratio >= 0.97",
     min(rows[64, 1.0]["throughput_ratio"], rows[64, 0.0]["throughput_ratio"]) >= 0.97),
    ("every row: the timed round's tokens were its recording", all(r["same_tokens"] for r in result["rows"])),
]
for name, ok in checks:
    print(f"{'PASS' if ok else 'FAIL'} {name}")
print(f"--step-ms {rows[1, 1.0]['tpot_off_ms']:.3f},{rows[1, 1.0]['step_on_ms']:.3f}  "
      "(batch-1 decode step off, verify step at k+1=5 tokens)")
PY
