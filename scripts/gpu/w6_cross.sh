#!/usr/bin/env bash
# W6 across two GPUs (issue 30, acceptance item 4) on nvidia-h100-x2 or nvidia-h200-x2: the Qwen3-8B KV (bf16, block
# of 16 tokens = 2.36 MB) from GPU0 to GPU1 over cuda_ipc (the receiver's block-copy kernel reads the sender's pool
# over NVLink) and over nccl (one gather, send and scatter per chunk), at 4,096 and 32,768 tokens, one
# transfer and 8 at once; then the kv_transfer GPU tests (-m gpu: the copy kernel's exact bytes, contract, endings,
# two processes across both GPUs); last, cuda_ipc on one GPU at 4,096 tokens for reference. About 4 minutes
# (BUDGET_S, default 270, caps the steps).
#   results: $OUT/w6_*.json (bench.kv_transfer.w6's figures), $OUT/pytest_gpu.xml, logs in $OUT/logs,
#   $OUT/env.txt (GPUs, NVLink topology, torch/NCCL), $OUT/summary.txt (steps, then GB/s against the targets:
#   4k tokens GPU0 -> GPU1, cuda_ipc >= 350 GB/s, nccl >= 300 GB/s)
# Usage (device repo root): source scripts/device_env.sh && OUT=... bash scripts/gpu/w6_cross.sh
set -uo pipefail
BUDGET_S=${BUDGET_S:-270}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# NOTE: NVLink multicast stays off on the lent machines; p2p send/recv never needs it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{
  nvidia-smi --query-gpu=index,name,memory.total --format=csv
  nvidia-smi topo -m
  python3 - <<'PY'
import torch, torch.distributed as dist
print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())
print("nccl", torch.cuda.nccl.version() if dist.is_nccl_available() else "unavailable")
n = torch.cuda.device_count()
print("peer access", [(i, j, torch.cuda.can_device_access_peer(i, j)) for i in range(n) for j in range(n) if i != j])
PY
} >"$OUT/env.txt" 2>&1

W6=(python3 -m bench --workload w6 --iters 10 --warmup 2)
CROSS=(--sender-device cuda:0 --receiver-device cuda:1 --tokens 4096,32768 --concurrency 1,8)
step w6_cuda_ipc_cross 75 "${W6[@]}" --kv-transfer-backend cuda_ipc "${CROSS[@]}" --json "$OUT/w6_cuda_ipc_cross.json"
step w6_nccl_cross 75 "${W6[@]}" --kv-transfer-backend nccl "${CROSS[@]}" --json "$OUT/w6_nccl_cross.json"
step pytest_gpu 150 python3 -m pytest -q -m gpu -o addopts="" --import-mode=importlib -p no:cacheprovider -rfEs \
  --durations=10 --junitxml="$OUT/pytest_gpu.xml" tests/kv_transfer
tail -1 "$LOGS/pytest_gpu.log" 2>/dev/null | sed 's/^/pytest_gpu: /' >>"$SUMMARY"
step w6_cuda_ipc_same 45 "${W6[@]}" --kv-transfer-backend cuda_ipc --sender-device cuda:0 --receiver-device cuda:0 \
  --tokens 4096 --iters 20 --warmup 3 --json "$OUT/w6_cuda_ipc_same.json"

python3 - "$OUT" <<'PY' | tee -a "$SUMMARY"
import json, pathlib, sys

out = pathlib.Path(sys.argv[1])
targets = {"cuda_ipc": 350.0, "nccl": 300.0}  # GB/s at 4k tokens, GPU0 -> GPU1
for name in ("w6_cuda_ipc_cross", "w6_nccl_cross", "w6_cuda_ipc_same"):
    path = out / f"{name}.json"
    if not path.exists():
        print(f"{name}: no result (see logs/{name}.log)")
        continue
    result = json.loads(path.read_text())
    cross = result["sender_device"] != result["receiver_device"]
    for size in result["sizes"]:
        target = targets[result["backend"]] if cross and size["tokens"] == 4096 else None
        verdict = "" if target is None else f"  target >= {target:.0f}: {'met' if size['gb_per_s'] >= target else 'MISSED'}"
        print(
            f"{result['backend']:8s} {result['sender_device']}->{result['receiver_device']} {size['tokens']:6d} tokens "
            f"x{size['concurrency']}: {size['bytes'] / 1e6:7.0f} MB {size['gb_per_s']:6.1f} GB/s, p50 "
            f"{size['latency_ms_p50']:7.2f} ms, p99 {size['latency_ms_p99']:7.2f} ms, bit-exact {size['verified']}{verdict}"
        )
    print(f"  ({result['receiver_device_name']}; receiver copy rate {result['receiver_copy_bandwidth_gb_s']} GB/s)")
PY
echo "total: $((SECONDS - START))s" | tee -a "$SUMMARY"
