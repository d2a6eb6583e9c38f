#!/usr/bin/env bash
# FP8 weights and FP8 KV cache on one GPU (H100/H200). First the on-device tuning, whose winners go into the tree's
# tables (the kernels read them at import) and to $OUT: the FP8 GEMV's tiles per Qwen3-8B projection
# (bench/kernels/fp8_gemv.py --write-table, the sweep of engine/layers/tune_fp8_gemv.py ->
# engine/layers/fp8_gemv_tiles.json; it also times the 2048-row prefill path per projection) and the decode kernel's
# tiles and split density on an fp8 KV pool at batch 64 (engine/attention/tune_decode.py ->
# engine/attention/decode_tuning.json). Then, with those tables: the fp8 GPU tests, W1 batch-1 TPOT and W2 2048-token
# TTFT bf16 vs fp8 (Qwen3-8B shape, random weights), and decode attention on fp8 KV at batch 1/64/256 (before W1 and
# W2). W6=1 adds W6 4k-token cuda_ipc transfers of bf16 and fp8 KV; SPOT=1 adds the 1P+1D router spot check on random
# weights (qwen3-0.6b shape; fp8 weights + fp8 KV over cuda_ipc, its greedy token ids against a colocated fp8
# engine's, its kv_transfer_bytes against a bf16 cluster's). Both were measured before.
#
#   source scripts/device_env.sh && OUT=$OUT/fp8 bash scripts/gpu/fp8.sh     (repo root; at most ~9 minutes)
#
# Writes exactly three files to $OUT: summary.txt (each step's exit code and time, the GPU tests' verdicts, then
# every figure against its target), tables.tar.gz (the two tuned tables at their repo paths: `tar -xzf` in the repo
# root) and logs.tar.gz (every step's log and JSON, the tables, the commands). Steps share BUDGET_S seconds
# (default 500 here); a step never runs past what is left, so the script ends in time even if something hangs.
set -u -o pipefail
BUDGET_S=${BUDGET_S:-500}
source "$(dirname "$0")/lib.sh"

W8B=(--model-shape qwen3-8b --max-num-seqs 8 --num-blocks 2048)
step gemv_fp8 130 python3 -m bench.kernels.fp8_gemv --out "$LOGS" --write-table
step tune_attention_fp8 240 python3 -m engine.attention.tune_decode --out "$LOGS"
cp engine/attention/decode_tuning.json "$LOGS/"
step gpu_tests 100 python3 -m pytest -q -s -m gpu -o addopts="" -p no:cacheprovider -rA tests/engine/test_fp8_gpu.py
step attention_fp8 45 python3 -m bench.kernels.attention --out "$LOGS" --kv-cache-dtype fp8 --sections decode
for q in none fp8; do
    step "w1_$q" 45 python3 -m bench --workload w1 "${W8B[@]}" --quantization "$q" --num-prompts 2 --input-len 128 \
        --output-len 256 --json "$LOGS/w1_$q.json"
done
for q in none fp8; do
    step "w2_$q" 40 python3 -m bench --workload w2 "${W8B[@]}" --quantization "$q" --num-prompts 3 --input-len 2048 \
        --json "$LOGS/w2_$q.json"
done
# NOTE: W6 (4k-token cuda_ipc transfers) is not rerun: run 1 measured fp8/bf16 bytes 0.500, both bit-exact, and
# nothing on the transfer path changed since. `W6=1` runs it again.
if [[ ${W6:-0} == 1 ]]; then
    for dtype in bfloat16 float8_e4m3fn; do
        step "w6_$dtype" 25 sh -c "python3 -m bench --workload w6 --kv-transfer-backend cuda_ipc --tokens 4096 \
            --iters 10 --warmup 2 --dtype $dtype > $LOGS/w6_$dtype.json"
    done
fi

if [[ ${SPOT:-0} == 1 ]]; then
# The spot check: random weights of the qwen3-0.6b shape (no checkpoint travels to the device), the same seed in
# every process; the router gets a word-level tokenizer whose token i is the word t<i>, so the prompt below is
# token ids 11, 22, ..., 440 and the streamed text names the generated ids.
SPOT_MODEL=shape:qwen3-0.6b
SPOT_TOKENIZER="$LOGS/spot_tokenizer"
PROMPT=$(seq -s " t" 11 11 440)
PROMPT="t$PROMPT"
python3 -c "
from bench.online.cluster_target import write_synthetic_tokenizer
from engine.models.shapes import MODEL_SHAPES
write_synthetic_tokenizer('$SPOT_TOKENIZER', MODEL_SHAPES['qwen3-0.6b']['vocab_size'])" >"$LOGS/spot_tokenizer.log" 2>&1

spot() {  # spot NAME POD_FLAGS...: a 1P+1D cluster over cuda_ipc with those pod flags, one greedy request
    local name=$1 left=$((BUDGET_S - (SECONDS - START)))
    shift
    if ((left < 45)); then
        echo "spot_$name: skipped, budget spent" | tee -a "$SUMMARY"
        return
    fi
    PDSERVE_TOKENIZER="$SPOT_TOKENIZER" python3 -m cli.main up --model "$SPOT_MODEL" --kv-transfer-backend cuda_ipc \
        --http-port 0 --metrics-port 0 --log-dir "$LOGS/spot_$name" --load-format dummy --num-blocks 1024 "$@" \
        >"$LOGS/spot_${name}_up.log" 2>&1 &
    local pid=$!
    local deadline=$((SECONDS + left - 30))
    until grep -q "listening on" "$LOGS/spot_${name}_up.log" || ((SECONDS > deadline)) || ! kill -0 $pid; do sleep 1; done
    step "spot_$name" 25 python3 -m cli.main generate --temperature 0 --max-tokens 24 "$PROMPT"
    kill -INT $pid  # the cluster drains and stops its processes; a hung stop is killed after 20 s
    for _ in $(seq 20); do kill -0 $pid 2>/dev/null || break; sleep 1; done
    kill -KILL $pid 2>/dev/null
    wait $pid
}
spot fp8 --quantization fp8 --kv-cache-dtype fp8
step colocated_fp8 60 python3 -c "
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from tests.engine.quant_support import greedy
engine = LLMEngine(engine_config('$SPOT_MODEL', load_format='dummy', quantization='fp8', kv_cache_dtype='fp8',
                                 num_blocks=1024))
print(greedy(engine, [list(range(11, 441, 11))], 24)[0])"
spot bf16 --quantization none
fi

python3 -m bench.reporting.gpu_summary "$LOGS" tests=gpu_tests w1=none,fp8 w2=none,fp8 fp8_gemv >>"$SUMMARY" 2>&1
python3 - "$LOGS" >>"$SUMMARY" 2>&1 <<'EOF'
import ast, json, pathlib, re, sys
out = pathlib.Path(sys.argv[1])
def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None
def verdict(ok):
    return "met" if ok else "MISSED"
r = load("tune_fp8_attention.json")
if r:
    print(f"decode attention fp8 tuning (kernel alone, b=64 ctx=4096): best {r['best']} = "
          f"{r['best_pct_of_copy']:.0f}% of copy; table {r['table']}")
    for row in r["checks"]:
        print(f"   check {row['name']}: {row.get('gb_s', 0):.0f} GB/s {row.get('error', '')}")
    top = sorted((row for row in r["sweep"] if "us" in row), key=lambda row: row["us"])[:4]
    print("   fastest: " + "; ".join(f"{row['gb_s']:.0f} GB/s {row['name']}" for row in top))
r = load("bench_triton_attention_fp8.json")
for row in (r or {}).get("decode", []):
    if row["batch"] == 64:
        print(f"decode attention fp8 KV b=64 ctx={row['context']}: {row['triton_gb_s']:.0f} GB/s = "
              f"{row['pct_of_copy']:.0f}% of copy bandwidth (target >= 80%: {verdict(row['pct_of_copy'] >= 80)})")
sizes = {}
for dtype in ("bfloat16", "float8_e4m3fn"):
    r = load(f"w6_{dtype}.json")
    size = next((s for s in (r or {}).get("sizes", []) if s["tokens"] == 4096), None)
    if size is None:
        print(f"w6 {dtype}: no result (not run without W6=1; run 1: fp8/bf16 bytes 0.500, bit-exact)")
        continue
    sizes[dtype] = size["bytes"]
    print(f"w6 cuda_ipc {dtype} 4096 tokens: {size['bytes'] / 1e6:.0f} MB, {size['gb_per_s']:.1f} GB/s, "
          f"p50 {size['latency_ms_p50']:.2f} ms, bit-exact {size['verified']}")
if len(sizes) == 2:
    print(f"w6 fp8/bf16 bytes: {sizes['float8_e4m3fn'] / sizes['bfloat16']:.3f} (target 0.5)")
def spot(name):
    try:
        text = (out / f"spot_{name}.log").read_text()
    except OSError:
        return None, None
    found = re.search(r"kv_transfer_bytes=(\d+)", text)
    return text, int(found.group(1)) if found else None
(fp8_text, fp8_bytes), (_, bf16_bytes) = spot("fp8"), spot("bf16")
if fp8_text is None:
    print("spot check: not run without SPOT=1 (run 2: 1P+1D fp8 == colocated, kv_transfer_bytes 0.500)")
    sys.exit()
cluster = None if fp8_text is None else [int(t) for t in re.findall(r"t(\d+)", fp8_text.split("[finish_reason")[0])]
try:
    colocated = ast.literal_eval((out / "colocated_fp8.log").read_text().strip().splitlines()[-1])
except (OSError, IndexError, ValueError, SyntaxError):
    colocated = None
same = bool(cluster) and colocated is not None and cluster == colocated[: len(cluster)]
print(f"spot fp8 1P+1D cluster (random qwen3-0.6b): {cluster}")
print(f"colocated fp8 engine:                       {colocated} (same greedy ids: {same})")
if fp8_text is not None and "[finish_reason" in fp8_text:
    print("   " + fp8_text[fp8_text.index("[finish_reason"):].splitlines()[0])
if fp8_bytes and bf16_bytes:
    print(f"kv_transfer_bytes fp8 {fp8_bytes} / bf16 {bf16_bytes} = {fp8_bytes / bf16_bytes:.3f} (target 0.5)")
EOF
echo "total: $((SECONDS - START))s" | tee -a "$SUMMARY"
tar -czf "$OUT/tables.tar.gz" engine/layers/fp8_gemv_tiles.json engine/attention/decode_tuning.json
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOGS"
