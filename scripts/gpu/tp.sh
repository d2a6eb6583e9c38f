#!/usr/bin/env bash
# Tensor parallel on a 2-GPU machine (nvidia-h100-x2 / nvidia-h200-x2; issues 15 and 30). About 6 minutes:
#   1. tests/engine/parallel/test_peer_all_reduce_gpu.py: the peer-memory all-reduce against NCCL (one-shot,
#      two-shot, in a CUDA graph)                                                  -> $OUT/gpu_tests.txt
#   2. bench.kernels.all_reduce: NCCL vs one-shot vs two-shot, 8 KB .. 32 MB       -> $OUT/all_reduce.{txt,json}
#   3. batch-1 decode TPOT (128-token prompt, 256 tokens) and TTFT of 2,048-token prompts, Qwen3-8B shape, bf16
#      random weights: TP=1 on GPU 0, TP=2 on GPUs 0-1 (peer memory), TP=2 with NCCL only; each in its own process
#                                                                                  -> $OUT/tp_results.jsonl
#   4. tests/engine/parallel/test_parallel_gpu.py: TP=2 (eager and CUDA graphs) and PP=2 engines in float32,
#      greedy-identical to one GPU on tiny Llama and Qwen3                        -> $OUT/gpu_tests.txt
#   5. the ratios TP=2 / TP=1 (acceptance: TPOT <= 0.65, TTFT <= 0.6)             -> $OUT/summary.txt
# Engine logs go to $OUT/tp.log. W6 across a TP=2 pod pair: scripts/gpu/tppods.sh.
# On 4 GPUs (acceptance TP=4 TPOT <= 0.45x): TP_RUNS="1:auto 2:auto 4:auto 4:nccl" AR_WORLD_SIZE=4.
# Usage (device repo root): source scripts/device_env.sh && bash scripts/gpu/tp.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=index,name,memory.total --format=csv
  nvidia-smi topo -m
  python3 -c 'import torch; print("torch", torch.__version__)'
} >"$OUT/gpus.txt" 2>&1
gpu_tests() {
  timeout "$1" python3 -m pytest -q -m gpu -o addopts="" -p no:cacheprovider "$2" 2>&1 | tail -15 >>"$OUT/gpu_tests.txt"
}
gpu_tests 150 tests/engine/parallel/test_peer_all_reduce_gpu.py
timeout 120 python3 -m bench.kernels.all_reduce --world-size "${AR_WORLD_SIZE:-2}" --out "$OUT" \
  >"$OUT/all_reduce.txt" 2>>"$OUT/tp.log"
for run in ${TP_RUNS:-1:auto 2:auto 2:nccl}; do
  tp="${run%%:*}" all_reduce="${run#*:}"
  echo "== TP=$tp all_reduce=$all_reduce" >>"$OUT/tp.log"
  timeout 180 python3 -m bench.offline.tp_decode --tensor-parallel-size "$tp" --all-reduce "$all_reduce" \
    2>>"$OUT/tp.log" | tail -1 >>"$OUT/tp_results.jsonl"
done
gpu_tests 200 tests/engine/parallel/test_parallel_gpu.py
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows = [json.loads(line) for line in (out / "tp_results.jsonl").read_text().splitlines() if line.startswith("{")]
by = {(r["tensor_parallel_size"], r["all_reduce"]): r for r in rows}
for (tp, ar), r in by.items():
    print(f"TP={tp} {ar:>4}: TPOT median {r['tpot_ms_median']:.3f} ms, TTFT@{r['ttft_input_len']} median "
          f"{r['ttft_ms_median']:.2f} ms {r['ttft_ms_all']}")
base = by.get((1, "auto"))
TPOT_BOUND = {2: 0.65, 4: 0.45}
for (tp, ar), r in by.items():
    if base and tp > 1:
        tpot = r["tpot_ms_median"] / base["tpot_ms_median"]
        ttft = r["ttft_ms_median"] / base["ttft_ms_median"]
        bound = TPOT_BOUND.get(tp, 1.0)
        verdict = "PASS" if tpot <= bound else "FAIL"
        ttft_note = f" ({'PASS' if ttft <= 0.6 else 'FAIL'}: <= 0.6)" if tp == 2 else ""
        print(f"TP={tp} {ar} / TP=1: TPOT {tpot:.3f} ({verdict}: <= {bound}), TTFT {ttft:.3f}{ttft_note}")
for line in (out / "gpu_tests.txt").read_text().splitlines():
    if " passed" in line or " failed" in line or "error" in line:
        print(line)
PY
