#!/usr/bin/env bash
# The specbench helper's GPU run (issue 13): the n-gram proposer's cost on the device's CPU (2k-token contexts,
# one call per request of a batch of 256), then W10 (scripts/gpu/w10.sh). Total run time: about 5 minutes.
# Run from the repo root: source scripts/device_env.sh && OUT=... bash scripts/gpu/specbench.sh
# Writes $OUT/proposer_timing.json and what w10.sh writes; prints both.
set -euo pipefail
OUT="${OUT:?set OUT to the folder for the results}"
mkdir -p "$OUT"
python3 -m bench.proposer_timing | tee "$OUT/proposer_timing.json"
bash scripts/gpu/w10.sh
