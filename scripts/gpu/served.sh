#!/usr/bin/env bash
# The served path at engine speed, Qwen3-0.6B shape (bf16 random weights), 128/32, on a 2-GPU machine
# (nvidia-h200-x2 or nvidia-h100-x2): 1 prefill pod on GPU 0, 1 decode pod on GPU 1, cuda_ipc. About 6 minutes:
#   1. the offline engine (w4), 256 and 128 requests at once                     -> $OUT/w4_256.json, w4_128.json
#   2. w8 closed loops of 128 and 256 streams through the router, default limits and router workers (and the
#      pods called directly)                                                       -> $OUT/w8.json
#   3. one router process vs 4 on one port where the router is the bottleneck: 128/8, 512 streams, 16 client
#      processes (16 connections), 2 prefill + 2 decode pods (one of each per GPU) so that the pods have room to
#      spare                                                                       -> $OUT/w8_workers{1,4}.json
#   4. the ratios (acceptance of the served-path issue)                           -> $OUT/summary.txt
# Usage (device repo root): source scripts/device_env.sh && bash scripts/gpu/served.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,memory.total --format=csv >"$OUT/gpus.txt" 2>&1
SHAPE=(--model-shape qwen3-0.6b --input-len 128)
for n in 256 128; do
  timeout 120 python3 -m bench --workload w4 "${SHAPE[@]}" --output-len 32 --num-prompts "$n" --max-num-seqs 256 \
    --num-blocks 16384 --json "$OUT/w4_$n.json" >"$OUT/w4_$n.log" 2>&1
done
CLUSTER=(--gpus 0,1 --kv-transfer-backend cuda_ipc --pod-arg "--num-blocks 16384" --no-progress)
timeout 240 python3 -m bench --workload w8 "${SHAPE[@]}" "${CLUSTER[@]}" --output-len 32 --concurrency 128,256 \
  --client-procs 8 --log-dir /tmp/logs-w8 --json "$OUT/w8.json" >"$OUT/w8.log" 2>&1
for workers in 1 4; do
  PDSERVE_ROUTER_WORKERS=$workers timeout 200 python3 -m bench --workload w8 "${SHAPE[@]}" --gpus 0,1 \
    --kv-transfer-backend cuda_ipc --pod-arg "--num-blocks 8192" --no-progress --num-prefill 2 --num-decode 2 \
    --output-len 8 --concurrency 512 --num-prompts 4096 --client-procs 16 --log-dir "/tmp/logs-w$workers" \
    --json "$OUT/w8_workers$workers.json" >"$OUT/w8_workers$workers.log" 2>&1
done
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, pathlib, sys

out = pathlib.Path(sys.argv[1])


def load(name: str) -> dict:
    path = out / name
    return json.loads(path.read_text()) if path.exists() and path.stat().st_size else {}


offline = {n: load(f"w4_{n}.json").get("engine", {}) for n in (256, 128)}
print(f"offline w4: 256 req {offline[256].get('output_tok_per_s')} tok/s, TPOT p50 {offline[256].get('tpot_ms_p50')} ms;"
      f" 128 req TPOT p50 {offline[128].get('tpot_ms_p50')} ms")
for row in load("w8.json").get("levels", []):
    direct, routed = row.get("direct", {}), row.get("router", {})
    print(f"w8 x{row['concurrency']}: router {routed.get('output_tok_per_s')} tok/s ({routed.get('failed')} failed),"
          f" TPOT p50 {routed.get('tpot_ms_p50')}; direct {direct.get('output_tok_per_s')} tok/s, TPOT p50"
          f" {direct.get('tpot_ms_p50')}; router CPU {row.get('router_cpu_ms_per_request')} ms/stream")
    print(f"  pods' CPU ms/request (router phase): {routed.get('pod_cpu_ms_per_request')};"
          f" clients' {routed.get('client_cpu_ms_per_request')}; KV transfer p50 direct"
          f" {direct.get('kv_transfer_ms_p50')} ms, router {routed.get('kv_transfer_ms_p50')} ms")
    if row["concurrency"] == 256 and offline[256].get("output_tok_per_s"):
        print(f"  router / offline = {routed.get('output_tok_per_s', 0) / offline[256]['output_tok_per_s']:.3f}"
              " (acceptance >= 0.70, 0 refused, 0 failed)")
    if row["concurrency"] == 128 and offline[128].get("tpot_ms_p50"):
        print(f"  decode TPOT p50 direct / offline(128) = {direct.get('tpot_ms_p50', 0) / offline[128]['tpot_ms_p50']:.2f}"
              " (acceptance <= 1.3)")
streams = {}
for workers in (1, 4):
    for row in load(f"w8_workers{workers}.json").get("levels", []):
        routed = row.get("router", {})
        streams[workers] = routed.get("streams_per_s")
        print(f"router workers {workers}: {streams[workers]} streams/s ({routed.get('failed')} failed), CPU"
              f" {row.get('router_cpu_ms_per_request')} ms/stream, {row.get('router_cpu_cores')} cores;"
              f" direct {row.get('direct', {}).get('streams_per_s')} streams/s")
if streams.get(1) and streams.get(4):
    print(f"4 workers / 1 = {streams[4] / streams[1]:.2f} (acceptance >= 3)")
PY
for f in /tmp/logs-w*/*.log; do echo "== $f"; grep -E "WARNING|ERROR" "$f" | tail -5; done >"$OUT/logs_tail.txt" 2>&1
# NOTE: at most 8 files come back from a device run: the figures travel as one archive.
(cd "$OUT" && tar czf served.tgz ./*.json ./*.log && rm -f ./*.json ./*.log)
