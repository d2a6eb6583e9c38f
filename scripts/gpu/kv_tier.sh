#!/usr/bin/env bash
# The KV host tier on the GPU (issue 31, engine/kv_tier): bench/offline/kv_tier.py on the Qwen3-8B shape (random bf16
# weights, CUDA graphs on).
# 1. W9-like prefix load: 8 shared prefixes of 4,096 tokens (32,768 tokens) over a device pool of 1,280 blocks (20,480
#    tokens), each request a prefix + 100 unique tokens, 8 tokens out, one at a time, round-robin: round 2's TTFT
#    without a host tier (every prefix recomputed) vs with a 16 GiB one (copied back).
# 2. Swap vs recompute at 2k and 16k tokens of context: a fresh prompt's prefill vs the blocks' copy out and back.
# Two 8B engines are built (about 1 minute each); total about 3 to 4 minutes on an H100, cut at 500 s.
# Run from the repo root: source scripts/device_env.sh && OUT=... bash scripts/gpu/kv_tier.sh
# Writes $OUT/kv_tier.json and $OUT/kv_tier.log; prints the figures and checks.
set -euo pipefail
OUT="${OUT:?set OUT to the folder for the results}"
mkdir -p "$OUT"
timeout 500 python3 -m bench.offline.kv_tier --model-shape qwen3-8b --dtype bfloat16 --num-blocks 1280 \
  --swap-space 16 --num-prefixes 8 --prefix-len 4096 --suffix-len 100 --output-len 8 --contexts 2048,16384 \
  --json "$OUT/kv_tier.json" >"$OUT/kv_tier.log" 2>&1 || { tail -30 "$OUT/kv_tier.log"; exit 1; }
python3 - "$OUT/kv_tier.json" <<'PY'
import json
import sys

result = json.load(open(sys.argv[1]))
print(result["device_name"], "qwen3-8b bfloat16")
off, on = result["prefix_tier"]
print(f"prefix tier: round-2 TTFT p50 {off['ttft_round2_ms_p50']:.1f} ms without, {on['ttft_round2_ms_p50']:.1f} ms "
      f"with ({off['ttft_round2_ms_p50'] / on['ttft_round2_ms_p50']:.2f}x); host-hit tokens {on['host_hit_tokens']}")
for row in result["swap_vs_recompute"]:
    swap = row["swap_out_ms"] + row["swap_in_ms"]
    print(f"context {row['context_tokens']:6d}: recompute {row['recompute_ms']:8.1f} ms, swap out+in {swap:7.1f} ms "
          f"({row['swap_gb_per_s']:.1f} GB/s), recompute/swap {row['recompute_ms'] / swap:.1f}x")
checks = [
    ("the second round hit the host tier", on["host_hit_tokens"] > 0),
    ("host tier TTFT below recompute's", on["ttft_round2_ms_p50"] < off["ttft_round2_ms_p50"]),
]
for name, ok in checks:
    print(f"{'PASS' if ok else 'FAIL'} {name}")
PY
