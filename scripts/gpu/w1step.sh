#!/usr/bin/env bash
# The batch-1 decode step's small kernels (issue 14, W1) on one GPU (H100/H200), in order:
# 1. the candidate tables written into the tree: PDL launches of RMSNorm, q/k norm + RoPE + store, decode attention
#    and its reduce (engine/layers/pdl_launches.json all true); the device split rule is on by default
#    (engine/attention/decode_tuning.py MIN_SPLIT_TOKENS = 256);
# 2. GPU tests on those tables: decode attention vs the float64 reference (short and long contexts, split bound x
#    device rule, PDL launches), the Triton layers (RMSNorm, RoPE + store, in and out of CUDA graphs), the fp8 KV
#    attention and cache writer, the engine vs transformers (CUDA graphs and eager), a random Qwen3 in int4 and in
#    fp8 against bf16 (CUDA graphs) and the PDL PTX checks;
# 3. per quantization (gptq, fp8, none: the Qwen3-8B shape, random weights) bench.decode_step_ab in one process:
#    variants main (knobs off: the kernels as on main), nosplit (device split rule), pdl (rule + PDL), each with
#    the per-kernel profile of a batch-1 decode step at contexts 128 and 2048, greedy ids of two requests, and W1
#    (128 in / 256 out, two prompts, as `bench --workload w1`); the pdl variant's W1 is written as w1_<method>.json.
#
#   source scripts/device_env.sh && OUT=$OUT/w1step bash scripts/gpu/w1step.sh     (repo root; at most ~7 minutes)
#
# Steps share BUDGET_S seconds (default 420). Writes exactly three files to $OUT: summary.txt (each step's exit code
# and time, the tests' verdicts, per method and context each variant's wall / idle / kernels per step and the small
# kernels' us, whether pdl's greedy ids equal nosplit's, W1 TPOT per variant against the targets), tables.tar.gz (the
# candidate tables at their repo paths) and logs.tar.gz (every step's log and JSON, the commands).
set -u -o pipefail
BUDGET_S=${BUDGET_S:-420}
source "$(dirname "$0")/lib.sh"

python3 - <<'PY'
import json
from pathlib import Path

path = Path("engine/layers/pdl_launches.json")
path.write_text(json.dumps(dict.fromkeys(json.loads(path.read_text()), True), indent=1) + "\n")
PY
TESTS=(tests/engine/test_triton_attention.py tests/engine/test_triton_layers.py tests/engine/test_pdl.py
    tests/engine/test_gpu_engine.py tests/engine/test_int4_gpu.py tests/engine/test_fp8_gpu.py)
# NOTE: the cases that run the changed kernels at the 8B head shape (and one odd GQA shape), the bf16 layers, and
# every engine test that runs them in CUDA graphs: the whole files' hundreds of Triton compiles would not fit.
PICK="decode or (mixed_batch and (q32kv8d128 or q9kv3d64)) or (rms_norm and bfloat16) or (rope_store and q32kv8d128)"
PICK+=" or replay_in_a_cuda_graph or (gemv_matches and bfloat16) or greedy or prompt_logits or int4_logits"
PICK+=" or attention_on_an_fp8 or cache_writer or pdl or successor"
step gpu_tests 130 python3 -m pytest -q -s -o addopts="" -p no:cacheprovider -rA "${TESTS[@]}" -k "$PICK"
# NOTE: gptq first (its random weights are quantized in memory: the slowest start), bf16 last (the baseline).
declare -A AB_LIMIT_S=([gptq]=110 [fp8]=90 [none]=85)
for method in gptq fp8 none; do
    step "decode_ab_$method" "${AB_LIMIT_S[$method]}" python3 -m bench.decode_step_ab --quantization "$method" \
        --json "$LOGS/decode_ab_$method.json" --w1-json "$LOGS/w1_$method.json"
done
python3 -m bench.gpu_summary "$LOGS" tests=gpu_tests decode_ab=gptq,fp8,none w1=none,fp8,gptq >>"$SUMMARY" 2>&1
echo "total: $((SECONDS - START))s" | tee -a "$SUMMARY"
tar -czf "$OUT/tables.tar.gz" engine/layers/pdl_launches.json engine/attention/decode_tuning.json
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOGS"
