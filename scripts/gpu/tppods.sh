#!/usr/bin/env bash
# Tensor-parallel pods (issue 15, KV shipped rank to rank): about 5 minutes on nvidia-h200-x2 (2 GPUs); on one GPU
# only step 1's cuda_ipc cases run (the rest skip) and step 3 is skipped, in about 1 minute.
#   1. tests/kv_transfer/test_ranked_transfer.py -m gpu: TP=2 rank-to-rank transfers of the contract over cuda_ipc
#      (both ranks on GPU 0; 3 cases) and nccl (GPU 0 -> GPU 1; 3 cases)              -> $OUT/ranked_tests.txt
#   2. tests/e2e/test_parallel_pods.py -m gpu (2 GPUs): a TP=2 prefill pod and a TP=2 decode pod (`--gpus 0,1`:
#      rank r of prefill on GPU r, of decode on GPU 1-r) serve through the router token-identically to one GPU,
#      float32, over cuda_ipc and over nccl (2 cases)                                   -> $OUT/pod_tests.txt
#   3. W6 over cuda_ipc, Qwen3-8B KV (144 KiB/token), 8k and 32k tokens: one rank (GPU 0 -> GPU 0), then a TP=2
#      pod pair (rank r: GPU r -> GPU r, two transfers at once under one id)          -> $OUT/w6_tp{1,2}.json
#      and the ratio of their GB/s per size (acceptance: TP=2 >= 1.5x TP=1)             -> $OUT/summary.txt
# Usage (device repo root): source scripts/device_env.sh && bash scripts/gpu/tppods.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,memory.total --format=csv >"$OUT/gpus.txt" 2>&1
timeout 120 python3 -m pytest -q -m gpu -o addopts="" -p no:cacheprovider tests/kv_transfer/test_ranked_transfer.py \
  2>&1 | tail -15 >"$OUT/ranked_tests.txt"
timeout 240 python3 -m pytest -q -m gpu -o addopts="" -p no:cacheprovider tests/e2e/test_parallel_pods.py \
  2>&1 | tail -30 >"$OUT/pod_tests.txt"
if [[ "$(nvidia-smi -L | wc -l)" -ge 2 ]]; then
  for tp in 1 2; do
    timeout 90 python3 -m bench --workload w6 --kv-transfer-backend cuda_ipc --tokens 8192,32768 --iters 5 \
      --warmup 2 --tensor-parallel-size "$tp" --json "$OUT/w6_tp$tp.json" >"$OUT/w6_tp$tp.log" 2>&1
  done
fi
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for name in ("ranked_tests.txt", "pod_tests.txt"):
    lines = (out / name).read_text().strip().splitlines()
    print(f"{name}: {lines[-1] if lines else 'no output'}")
runs = {tp: out / f"w6_tp{tp}.json" for tp in (1, 2)}
if not all(path.exists() for path in runs.values()):
    print("W6 TP=1 vs TP=2: not run (needs 2 GPUs) or failed: see w6_tp*.log")
    sys.exit(0)
sizes = {tp: {s["tokens"]: s for s in json.loads(path.read_text())["sizes"]} for tp, path in runs.items()}
for tokens in sorted(sizes[1]):
    one, two = sizes[1][tokens], sizes[2][tokens]
    ratio = two["gb_per_s"] / one["gb_per_s"]
    verdict = "PASS" if ratio >= 1.5 and one["verified"] and two["verified"] else "FAIL"
    print(f"W6 cuda_ipc {tokens} tokens: TP=1 {one['gb_per_s']:.0f} GB/s, TP=2 {two['gb_per_s']:.0f} GB/s, "
          f"ratio {ratio:.2f} ({verdict}: >= 1.5, all blocks verified)")
PY
