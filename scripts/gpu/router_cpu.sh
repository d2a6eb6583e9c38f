#!/usr/bin/env bash
# The served-path issue's acceptance item 3 (#29) on a 2-GPU machine (nvidia-h200-x2 or nvidia-h100-x2): the router's
# CPU per 128/32 stream at saturation and 1 vs 4 router processes on one port, where the router is the bottleneck.
# About 8 minutes:
#   1. real pods, Qwen3-0.6B shape (bf16 random weights), 2 prefill + 2 decode pods (one of each per GPU, cuda_ipc,
#      --num-blocks 8192), 512 streams of 128/32, 16 client processes; `--workers` 1 then 4. W8 runs the pods
#      directly first (their streams/s: the room they have to spare), then through the router, whose CPU is the
#      router processes and their tokenizer workers                              -> $OUT/w8_32_workers{1,4}.json
#   2. the same router between stand-in pods that compute nothing (bench/online/standin_pods.py: 4 prefill + 4
#      decode processes, a 4 ms decode step clock), 512 streams, 16 client processes; `--workers` 1 then 4; CPU of the
#      router's serving processes alone (not their tokenizer workers)         -> $OUT/standin_workers{1,4}.json
#   3. the ratios                                                                  -> $OUT/summary.txt
# Bounds (#29, item 3): one router process <= 2.5 ms of CPU per 32-token stream; 4 processes >= 3x the streams/s of 1.
# Usage (device repo root): source scripts/device_env.sh && bash scripts/gpu/router_cpu.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,memory.total --format=csv >"$OUT/gpus.txt" 2>&1
nproc >"$OUT/cores.txt"
for workers in 1 4; do
  PDSERVE_ROUTER_WORKERS=$workers timeout 280 python3 -m bench --workload w8 --model-shape qwen3-0.6b \
    --input-len 128 --output-len 32 --gpus 0,1 --kv-transfer-backend cuda_ipc --pod-arg "--num-blocks 8192" \
    --no-progress --num-prefill 2 --num-decode 2 --concurrency 512 --num-prompts 8192 --client-procs 16 \
    --log-dir "/tmp/logs-rcpu-w$workers" --json "$OUT/w8_32_workers$workers.json" >"$OUT/w8_32_workers$workers.log" 2>&1
done
for workers in 1 4; do
  timeout 150 python3 -m bench.online.router_cpu --workers "$workers" --num-pods 4 --client-procs 16 \
    --concurrency 512 --num-prompts $((workers * 6000)) --warmup-prompts 1000 --input-len 128 --output-len 32 \
    --json "$OUT/standin_workers$workers.json" >"$OUT/standin_workers$workers.log" 2>&1
done
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, pathlib, sys

out = pathlib.Path(sys.argv[1])


def load(name: str) -> dict:
    path = out / name
    return json.loads(path.read_text()) if path.exists() and path.stat().st_size else {}


streams = {}
for workers in (1, 4):
    for row in load(f"w8_32_workers{workers}.json").get("levels", []):
        routed, direct = row.get("router", {}), row.get("direct", {})
        streams[workers] = routed.get("streams_per_s")
        print(f"real pods, router workers {workers}: {streams[workers]} streams/s ({routed.get('failed')} failed),"
              f" router + tokenizer CPU {row.get('router_cpu_ms_per_request')} ms/stream,"
              f" {row.get('router_cpu_cores')} cores; pods direct {direct.get('streams_per_s')} streams/s;"
              f" clients' CPU {routed.get('client_cpu_ms_per_request')} ms/stream")
if streams.get(1) and streams.get(4):
    print(f"  real pods: 4 workers / 1 = {streams[4] / streams[1]:.2f} (bound >= 3)")
standin = {workers: load(f"standin_workers{workers}.json") for workers in (1, 4)}
for workers, row in standin.items():
    print(f"stand-in pods, router workers {workers}: {row.get('streams_per_s')} streams/s ({row.get('failed')} failed),"
          f" router CPU {row.get('router_cpu_ms_per_stream')} ms/stream (bound <= 2.5 with 1 worker),"
          f" {row.get('router_cores')} cores, tokenizer {row.get('tokenizer_cpu_ms_per_stream')} ms/stream,"
          f" {row.get('client_messages_per_stream')} messages/stream; clients {row.get('client_cpu_ms_per_stream')},"
          f" pods {row.get('pods_cpu_ms_per_stream')} ms/stream")
if standin[1].get("streams_per_s") and standin[4].get("streams_per_s"):
    print(f"  stand-in pods: 4 workers / 1 = {standin[4]['streams_per_s'] / standin[1]['streams_per_s']:.2f} (bound >= 3)")
PY
for f in /tmp/logs-rcpu-w*/*.log; do echo "== $f"; grep -E "WARNING|ERROR" "$f" | tail -5; done >"$OUT/logs_tail.txt" 2>&1
# NOTE: at most 8 files come back from a device run: the figures travel as one archive.
(cd "$OUT" && tar czf router_cpu.tgz ./*.json ./*.log && rm -f ./*.json ./*.log)
