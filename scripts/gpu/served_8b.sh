#!/usr/bin/env bash
# The served path on the Qwen3-8B shape (bf16 random weights) on a 2-GPU machine (nvidia-h200-x2 or -h100-x2),
# 1 prefill pod on GPU 0, 1 decode pod on GPU 1, cuda_ipc. About 9 minutes:
#   1. the offline engine (w4), 512/128, 256 requests at once                     -> $OUT/w4_8b.json
#   2. w8: 256 streams of 512/128 through the router, default limits (and the pods called directly) -> $OUT/w8_8b.json
#   3. W7 4096/256 with the pods' default KV sizing, SLO TTFT 1.5 s, TPOT 15 ms     -> $OUT/w7.json
#   4. the ratios and failure counts                                               -> $OUT/summary_8b.txt
# Usage (device repo root): source scripts/device_env.sh && bash scripts/gpu/served_8b.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
SHAPE=(--model-shape qwen3-8b)
timeout 150 python3 -m bench --workload w4 "${SHAPE[@]}" --input-len 512 --output-len 128 --num-prompts 256 \
  --max-num-seqs 256 --json "$OUT/w4_8b.json" >"$OUT/w4_8b.log" 2>&1
CLUSTER=(--gpus 0,1 --kv-transfer-backend cuda_ipc --no-progress)
timeout 200 python3 -m bench --workload w8 "${SHAPE[@]}" "${CLUSTER[@]}" --input-len 512 --output-len 128 \
  --concurrency 256 --num-prompts 1024 --client-procs 8 --json "$OUT/w8_8b.json" \
  >"$OUT/w8_8b.log" 2>&1
CUDA_VISIBLE_DEVICES=0,1 timeout 300 python3 -m bench --workload w7 "${SHAPE[@]}" "${CLUSTER[@]}" \
  --input-len 4096 --output-len 256 --request-rates 4,8,12,16 --duration-s 8 --slo-ttft-ms 1500 --slo-tpot-ms 15 \
  --json "$OUT/w7.json" >"$OUT/w7.log" 2>&1
python3 - "$OUT" <<'PY' | tee "$OUT/summary_8b.txt"
import json, pathlib, sys

out = pathlib.Path(sys.argv[1])


def load(name: str) -> dict:
    path = out / name
    return json.loads(path.read_text()) if path.exists() and path.stat().st_size else {}


offline = load("w4_8b.json").get("engine", {}).get("output_tok_per_s")
print(f"offline w4 8B 512/128 x256: {offline} tok/s")
for row in load("w8_8b.json").get("levels", []):
    routed, direct = row.get("router", {}), row.get("direct", {})
    print(f"w8 8B x{row['concurrency']}: router {routed.get('output_tok_per_s')} tok/s ({routed.get('failed')} failed),"
          f" direct {direct.get('output_tok_per_s')} tok/s")
    if offline:
        print(f"  router / offline = {routed.get('output_tok_per_s', 0) / offline:.3f} (acceptance >= 0.85)")
w7 = load("w7.json")
for system in ("colocated", "disaggregated"):
    result = w7.get(system, {})
    rates = [(r.get("offered_req_per_s"), r.get("slo_attainment"), r.get("failed")) for r in result.get("rates", [])]
    print(f"w7 {system}: goodput/GPU {result.get('goodput_req_per_s_per_gpu')}; (rate, attainment, failed) {rates}")
PY
(cd "$OUT" && tar czf served_8b.tgz ./*.json ./*.log && rm -f ./*.json ./*.log)
