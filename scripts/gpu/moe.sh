#!/usr/bin/env bash
# MoE (issue 32, part 1) on a 4-GPU machine (nvidia-h100-x4; H200 x4 as well): Qwen3-30B-A3B shape, bf16 random
# weights. About 9 minutes:
#   1. tests/engine/test_moe_gpu.py: the Triton experts against the torch reference (30B-A3B and Mixtral-8x7B expert
#      shapes, batch 1 to 2048 tokens, expert parallel over 1/2/4 ranks), in a CUDA graph, and the tiny Qwen3-MoE and
#      Mixtral through the engine on the GPU against transformers                    -> logs/gpu_tests.log
#   2. bench.offline.moe for TP=1 (one GPU), TP=2 + expert parallel, TP=4 + expert parallel, each in its own process:
#      batch-1 TPOT (128-token prompt, 256 tokens) over its floor (active bytes per step / the GPUs' copy bandwidth)
#      and W4 128/128 output tok/s at 64 and 256 requests at once                    -> logs/moe_*.json
#   3. the figures against the target (batch-1 TPOT <= 1.5x its floor)               -> summary.txt
# Usage (device repo root): source scripts/device_env.sh && OUT=$OUT/moe BUDGET_S=540 bash scripts/gpu/moe.sh
set -u -o pipefail
BUDGET_S=${BUDGET_S:-540}
source "$(dirname "$0")/lib.sh"

nvidia-smi --query-gpu=index,name,memory.total --format=csv >"$LOGS/gpus.txt" 2>&1
step gpu_tests 120 python3 -m pytest -q -m gpu -o addopts="" -p no:cacheprovider -rA tests/engine/test_moe_gpu.py
# NOTE: TP=1 holds all 61 GB of weights on one GPU, beside 4608 KV blocks (7.2 GB; W4 at 256 x 256 tokens needs 4096).
step moe_tp1 150 sh -c "python3 -m bench.offline.moe > $LOGS/moe_tp1.json"
step moe_tp2_ep 130 sh -c "python3 -m bench.offline.moe --tensor-parallel-size 2 --enable-expert-parallel \
    > $LOGS/moe_tp2_ep.json"
step moe_tp4_ep 130 sh -c "python3 -m bench.offline.moe --tensor-parallel-size 4 --enable-expert-parallel \
    > $LOGS/moe_tp4_ep.json"

python3 - "$LOGS" >>"$SUMMARY" 2>&1 <<'PY'
import json, pathlib, sys
logs = pathlib.Path(sys.argv[1])
tests = (logs / "gpu_tests.log").read_text().strip().splitlines() if (logs / "gpu_tests.log").exists() else []
print("gpu tests:", tests[-1] if tests else "no result")
for name in ("moe_tp1", "moe_tp2_ep", "moe_tp4_ep"):
    try:
        r = json.loads((logs / f"{name}.json").read_text().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        print(f"{name}: no result (see logs/{name}.log)")
        continue
    verdict = "met" if r["tpot_over_floor"] <= 1.5 else "MISSED"
    print(f"{name} ({r['device_name']}, {r['copy_bandwidth_gb_s']:.0f} GB/s per GPU): batch-1 TPOT "
          f"{r['tpot_ms_median']:.2f} ms, floor {r['tpot_floor_ms']:.2f} ms ({r['active_bytes_per_step'] / 1e9:.2f} GB)"
          f" -> {r['tpot_over_floor']:.2f}x (target <= 1.5x: {verdict})")
    for c, w in r["w4"].items():
        print(f"   W4 128/128 x{c}: {w['output_tok_per_s']:.0f} output tok/s, TPOT p50 {w['tpot_ms_p50']:.1f} ms, "
              f"TTFT p50 {w['ttft_ms_p50']:.0f} ms")
PY
echo "total: $((SECONDS - START))s" | tee -a "$SUMMARY"
cat "$SUMMARY"
