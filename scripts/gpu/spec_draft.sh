#!/usr/bin/env bash
# Draft-model speculation on the GPU (issue 31, part 2): the gpu-marked draft tests, then scripts/gpu/spec_draft.py:
# a Qwen3-0.6B-shape draft for a Qwen3-8B-shape target (random bf16 weights, CUDA graphs on, batch 1, 128 prompt +
# 256 output tokens) at controlled acceptance (draft_replay: the draft runs in full, its proposals are replay's
# recording, corrupted at 1 - acceptance), k = 4 fixed (min_acceptance 0) at acceptance 0.8, 1.0, 0.6; the default
# adaptive length at 0.8 and 0.0; then a 2048-token prompt's first draft round (the draft prefilling
# the prompt itself, as on a decode pod) against the target's TTFT. Per row: TPOT on / off, measured acceptance, the
# draft's wall time per round and per proposed token. Three 8B engines are built in turn: about 5 minutes on an H100 (the
# script is cut at 420 s; results.json is written after every row).
# Run from the repo root: source scripts/device_env.sh && OUT=... bash scripts/gpu/spec_draft.sh
# Writes $OUT/spec_draft/tests.txt (pytest) and $OUT/spec_draft/results.json; prints one line per row, then the checks
# (PASS/FAIL; the aim: acceptance 0.8, k = 4, batch-1 TPOT <= 0.5x off).
set -euo pipefail
OUT="${OUT:?set OUT to the folder for the results}"
mkdir -p "$OUT/spec_draft"
timeout 150 python3 -m pytest -q -m gpu -o addopts="" -p no:cacheprovider tests/engine/spec/test_spec_draft_gpu.py \
  >"$OUT/spec_draft/tests.txt" 2>&1 || echo "GPU TESTS FAILED (see spec_draft/tests.txt)"
tail -3 "$OUT/spec_draft/tests.txt"
timeout 420 python3 scripts/gpu/spec_draft.py "$OUT/spec_draft/results.json"
