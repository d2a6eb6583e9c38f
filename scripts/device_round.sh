#!/usr/bin/env bash
# One device run of the offline engine figures (docs/benchmarks.md): idle time, W1, W2, W3 with the transformers
# baseline, after the GPU correctness tests of the engine and the fused kernels.
# Usage (device repo root): bash scripts/device_round.sh
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
log=$OUT/log.txt
bench() { python3 -m bench "$@" 2>&1 | grep -v "capturing CUDA graphs" | tail -12 >>"$log"; }
python3 -m pytest -q -m gpu -o addopts="" -p no:cacheprovider tests/engine/test_gpu_engine.py \
  tests/engine/test_triton_layers.py tests/engine/test_triton_attention.py tests/engine/test_sampler.py 2>&1 \
  | tail -15 >"$OUT/gpu_tests.txt"
bench --workload idle --model-shape qwen3-0.6b --batch-size 64 --input-len 512 --num-blocks 8192 --json "$OUT/idle.json"
bench --workload w1 --model-shape qwen3-8b --num-prompts 2 --input-len 128 --output-len 512 --max-num-seqs 8 \
  --num-blocks 2048 --json "$OUT/w1_128.json"
bench --workload w1 --model-shape qwen3-8b --num-prompts 2 --input-len 2048 --output-len 512 --max-num-seqs 8 \
  --num-blocks 2048 --json "$OUT/w1_2048.json"
bench --workload w2 --model-shape qwen3-8b --num-prompts 3 --input-len 2048 --max-num-seqs 8 --num-blocks 2048 \
  --json "$OUT/w2.json"
bench --workload w3 --model-shape qwen3-0.6b --num-blocks 16384 --baseline transformers --baseline-batch-size 256 \
  --json "$OUT/w3.json"
