#!/usr/bin/env bash
# Where the served path's CPU goes, Qwen3-0.6B shape, 128/32, 256 streams, on a 2-GPU machine (1 prefill pod on
# GPU 0, 1 decode pod on GPU 1, cuda_ipc): W8 (pods direct, then through the router) while py-spy samples every
# process of the cluster (pod fronts, engine cores, one router worker) for PROFILE_S seconds. About 3 minutes.
#   $OUT/w8.json                   the run's figures, with each pod's front and core CPU ms per request
#   $OUT/profiles.tgz              py-spy's collapsed stacks per process (--threads: folded by thread)
# Usage (device repo root; py-spy's static binary carried in .prof/):
#   source scripts/device_env.sh && bash scripts/gpu/served_profile.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
SPY="${PY_SPY:-$PWD/.prof/py-spy}"
PROFILE_S="${PROFILE_S:-40}"
PROMPTS="${PROMPTS:-12000}"
mkdir -p "$OUT/prof"
PDSERVE_ROUTER_WORKERS="${PDSERVE_ROUTER_WORKERS:-2}" timeout 400 python3 -m bench --workload w8 \
  --model-shape qwen3-0.6b --gpus 0,1 --kv-transfer-backend cuda_ipc --pod-arg "--num-blocks 16384" --no-progress \
  --input-len 128 --output-len 32 --concurrency 256 --num-prompts "$PROMPTS" --client-procs 8 \
  --log-dir /tmp/logs-prof --json "$OUT/w8.json" >"$OUT/w8.log" 2>&1 &
bench=$!
# The engine cores exist once the pods load their models; the warm-up follows their CUDA graphs.
for _ in $(seq 240); do
  [[ $(pgrep -fc "engine.core") -ge 2 ]] && break
  sleep 1
done
until grep -q "serving on" /tmp/logs-prof/decode-0.log 2>/dev/null; do sleep 1; done
sleep 15
declare -A names
for pid in $(pgrep -f "engine.core"); do
  front=$(ps -o ppid= -p "$pid" | tr -d ' ')
  names[$pid]="core-$(ps -o args= -p "$front" | grep -o "pod-id [a-z]*-[0-9]*" | cut -d' ' -f2)"
done
for pid in $(pgrep -f "m prefill_service"); do names[$pid]="front-prefill"; done
for pid in $(pgrep -f "m decode_service"); do names[$pid]="front-decode"; done
worker=$(pgrep -f "router\.worker|-m router" | tail -1)
[[ -n "$worker" ]] && names[$worker]="router"
for pid in "${!names[@]}"; do
  "$SPY" record -p "$pid" -d "$PROFILE_S" -r 250 --threads --nonblocking -f raw -o "$OUT/prof/${names[$pid]}.txt" \
    >"$OUT/prof/${names[$pid]}.spy.log" 2>&1 &
done
wait "$bench"
echo "bench rc $?"
python3 - "$OUT/w8.json" <<'PY'
import json, sys

for row in json.load(open(sys.argv[1])).get("levels", []):
    for phase in ("direct", "router"):
        r = row.get(phase, {})
        print(phase, r.get("output_tok_per_s"), "tok/s, TTFT p50", r.get("ttft_ms_p50"), "TPOT p50", r.get("tpot_ms_p50"))
        print(" pods' CPU ms/request:", r.get("pod_cpu_ms_per_request"), "clients':", r.get("client_cpu_ms_per_request"))
    print("router CPU ms/request:", row.get("router_cpu_ms_per_request"))
PY
(cd "$OUT" && tar czf profiles.tgz prof w8.log && rm -rf prof w8.log)
