#!/usr/bin/env bash
# Image inputs on the GPU (issue 32, part 2): the gpu-marked LLaVA tests (the vision encoder on CUDA, Triton attention,
# CUDA graphs; greedy output identical to transformers in float32) and the image path's CPU tests on that machine.
# Run from the repo root: source scripts/device_env.sh && OUT=... bash scripts/gpu/vision.sh
# Writes $OUT/vision/tests.txt (pytest); prints its last lines. About a minute.
set -euo pipefail
OUT="${OUT:-/tmp/vision-out}"
mkdir -p "$OUT/vision"
python3 -c "import PIL; print('pillow', PIL.__version__)"
python3 -m pytest -q -m gpu -o addopts="" -p no:cacheprovider tests/engine/multimodal/test_llava_gpu.py \
  > "$OUT/vision/tests.txt" 2>&1 || echo "GPU TESTS FAILED (see vision/tests.txt)"
python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/engine/multimodal tests/router/test_prompt_images.py \
  -m "not gpu" >> "$OUT/vision/tests.txt" 2>&1 || echo "CPU TESTS FAILED (see vision/tests.txt)"
grep -E "passed|failed|error" "$OUT/vision/tests.txt" | tail -4
