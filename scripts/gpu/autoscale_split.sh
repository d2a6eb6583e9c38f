#!/usr/bin/env bash
# W12 autoscale split (issue 30, item 2) on a 4-GPU machine (nvidia-h100-x4 or nvidia-h200-x4): Qwen3-8B shape, bf16
# random weights, cuda_ipc, 4096/256 Poisson at $RATE req/s (default 12), SLO TTFT 1.5 s and TPOT 15 ms. About 9
# minutes in all (BUDGET_S, default 535, caps the steps):
#   1. the autoscaler from 1 prefill + 1 decode on GPUs 0-3, one pod per GPU (--max-total-pods 4), deciding every 5 s,
#      $AUTO_S (240) seconds of steady load, judged on its last quarter         -> $OUT/auto/{timeline.csv,svg,w12.json}
#   2. the fixed split $FIXED (2:2), the same load for $FIXED_S (45) seconds, its last third -> $OUT/fixed/...
#   3. both timelines side by side                                              -> $OUT/autoscale-split.svg
#      the final splits, SLO attainment and goodput per GPU of those last parts, failures -> $OUT/summary.txt
# The prefill queue measure assumes 38,000 prompt tokens/s per prefill pod (W2 4k on an H100: 107 ms per 4,096
# tokens); its high threshold is half the TTFT SLO (0.75 s); decode is held against TPOT 15 ms (over 12 ms per step:
# scale out). Pods load with the default KV sizing; logs in $OUT/logs.
# Environment: RATE, AUTO_S, FIXED (P:D), FIXED_S, BUDGET_S. A step cut by its time limit still writes its files
# (marked interrupted) before its cluster stops.
# Usage (device repo root): source scripts/device_env.sh && bash scripts/gpu/autoscale_split.sh
set -uo pipefail
BUDGET_S=${BUDGET_S:-535}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
RATE=${RATE:-12}
AUTO_S=${AUTO_S:-240}
FIXED=${FIXED:-2:2}
FIXED_S=${FIXED_S:-45}
nvidia-smi --query-gpu=index,name,memory.total --format=csv >"$OUT/gpus.txt" 2>&1
W12=(python3 -m bench --workload w12 --model-shape qwen3-8b --gpus 0,1,2,3 --kv-transfer-backend cuda_ipc
  --input-len 4096 --output-len 256 --request-rate "$RATE" --slo-ttft-ms 1500 --slo-tpot-ms 15 --sample-interval-s 5
  --no-progress)
step auto 400 "${W12[@]}" --duration-s "$AUTO_S" --out-dir "$OUT/auto" --log-dir "$LOGS/auto" \
  --autoscale-interval-s 5 --scale-down-window-s 120 --action-timeout-s 300 --prefill-tokens-per-s 38000 \
  --ttft-queue-fraction 0.5 --final-fraction 0.25
if ((BUDGET_S - (SECONDS - START) >= 130)); then
  step fixed 170 "${W12[@]}" --duration-s "$FIXED_S" --split "$FIXED" --out-dir "$OUT/fixed" --log-dir "$LOGS/fixed"
else
  echo "fixed: skipped, $((BUDGET_S - (SECONDS - START))) s left" | tee -a "$SUMMARY"
fi
csvs=()
for run in auto fixed; do [[ -s "$OUT/$run/timeline.csv" ]] && csvs+=("$OUT/$run/timeline.csv"); done
if ((${#csvs[@]})); then
  python3 scripts/plot_autoscale.py --panels w12 "${csvs[@]}" "$OUT/autoscale-split.svg" \
    --note "$(head -2 "$OUT/gpus.txt" | tail -1 | cut -d, -f2 | xargs) x4, $(date -u +%F), scripts/gpu/autoscale_split.sh"
fi
python3 - "$OUT" <<'PY' | tee -a "$SUMMARY"
import json, pathlib, sys

out = pathlib.Path(sys.argv[1])
finals = {}
for run in ("auto", "fixed"):
    path = out / run / "w12.json"
    if not path.exists():
        print(f"{run}: no result (see logs/{run}.log)")
        continue
    result = json.loads(path.read_text())
    final, whole = result["final"], result["whole_run"]
    finals[run] = final
    changes = " -> ".join(f"{c['prefill_pods']}:{c['decode_pods']} at {c['t_s']:.0f}s" for c in result["split_changes"])
    cut = " (CUT SHORT: figures up to the cut)" if result.get("interrupted") else ""
    print(f"{result['mode']}{cut}: splits {changes}")
    print(f"  last part ({final['from_s']:.0f}-{final['to_s']:.0f} s): split {final['split']}, GPUs {final['gpus_used']}, "
          f"attainment {final['slo_attainment']}, TTFT p90 {final['ttft_ms_p90']} ms, TPOT p90 {final['tpot_ms_p90']} ms, "
          f"goodput {final['goodput_req_per_s']} req/s = {final['goodput_req_per_s_per_gpu']} req/s/GPU")
    print(f"  whole run: {whole['requests']} completed, {whole['failed']} failed {whole.get('errors', '')}")
auto, fixed = finals.get("auto", {}), finals.get("fixed", {})
if auto.get("goodput_req_per_s_per_gpu") and fixed.get("goodput_req_per_s_per_gpu"):
    ratio = auto["goodput_req_per_s_per_gpu"] / fixed["goodput_req_per_s_per_gpu"]
    print(f"autoscaler / fixed goodput per GPU over the last part: {ratio:.3f} (acceptance: >= 0.85)")
PY
echo "results: $OUT/summary.txt, $OUT/autoscale-split.svg, $OUT/auto/, $OUT/fixed/ (timeline.csv, timeline.svg, w12.json), logs in $LOGS"
