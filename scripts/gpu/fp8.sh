#!/usr/bin/env bash
# FP8 weights and FP8 KV cache on one GPU (H100/H200): the fp8 GPU tests, then bf16 and fp8 side by side in one
# run: W1 batch-1 TPOT and W2 2048-token TTFT (Qwen3-8B shape, random weights), decode attention at batch 64 on an
# fp8 KV pool (with tile and split sweeps), W6 4k-token cuda_ipc transfers of bf16 and fp8 KV, the FP8 GEMV per 8B
# projection with a tile sweep, and, if time is left, a 1P+1D router spot check (SmolLM2, fp8 weights + fp8 KV over
# cuda_ipc, against a colocated fp8 engine and a bf16 cluster's kv_transfer_bytes).
#
#   source scripts/device_env.sh && OUT=/some/folder bash scripts/gpu/fp8.sh     (repo root; at most ~6 minutes)
#
# Writes to $OUT: one log/JSON per step, commands.txt, and summary.txt (each step's exit code and time, then every
# figure against its target). Steps share BUDGET_S seconds (default 330); a step never runs past what is left, so
# the script ends in time even if something hangs.
set -u -o pipefail

OUT=${OUT:?set OUT to the folder for the results}
BUDGET_S=${BUDGET_S:-330}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD:$PWD/protos${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
START=$SECONDS
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"

step() {  # step NAME LIMIT_S COMMAND...: at most LIMIT_S (or what the budget has left), output in $OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    local left=$((BUDGET_S - (SECONDS - START)))
    if ((left < 20)); then
        echo "$name: skipped, budget spent" | tee -a "$SUMMARY"
        return
    fi
    ((limit > left)) && limit=$left
    local began=$SECONDS
    echo "== $name (at most ${limit}s): $*" >>"$OUT/commands.txt"
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "$name: rc=$? in $((SECONDS - began))s" | tee -a "$SUMMARY"
}

W8B=(--model-shape qwen3-8b --max-num-seqs 8 --num-blocks 2048)
step gpu_tests 110 python3 -m pytest -q -s -m gpu -o addopts="" -p no:cacheprovider -rA tests/engine/test_fp8_gpu.py
for q in none fp8; do
    step "w1_$q" 50 python3 -m bench --workload w1 "${W8B[@]}" --quantization "$q" --num-prompts 2 --input-len 128 \
        --output-len 256 --json "$OUT/w1_$q.json"
done
for q in none fp8; do
    step "w2_$q" 40 python3 -m bench --workload w2 "${W8B[@]}" --quantization "$q" --num-prompts 3 --input-len 2048 \
        --json "$OUT/w2_$q.json"
done
# The tile and split sweeps too: the decode tiles were tuned on bf16 KV (docs/benchmarks.md), not on fp8.
step attention_fp8 70 python3 bench/kernel_attention.py --out "$OUT" --kv-cache-dtype fp8 --sections decode,decode_sweeps
for dtype in bfloat16 float8_e4m3fn; do
    step "w6_$dtype" 30 sh -c "python3 -m bench --workload w6 --kv-transfer-backend cuda_ipc --tokens 4096 --iters 10 \
        --warmup 2 --dtype $dtype > $OUT/w6_$dtype.json"
done
step gemv_fp8 45 python3 bench/kernel_fp8_gemv.py --out "$OUT"

spot() {  # spot NAME [VAR=VALUE...]: a 1P+1D cluster over cuda_ipc with those variables, one greedy request
    local name=$1 left=$((BUDGET_S - (SECONDS - START)))
    shift
    if ((left < 60)); then
        echo "spot_$name: skipped, budget spent" | tee -a "$SUMMARY"
        return
    fi
    env "$@" python3 -m cli.main up --kv-transfer-backend cuda_ipc --http-port 0 --metrics-port 0 \
        --log-dir "$OUT/spot_$name" >"$OUT/spot_${name}_up.log" 2>&1 &
    local pid=$!
    local deadline=$((SECONDS + left - 30))
    until grep -q "listening on" "$OUT/spot_${name}_up.log" || ((SECONDS > deadline)) || ! kill -0 $pid; do sleep 1; done
    step "spot_$name" 30 python3 -m cli.main generate --temperature 0 --max-tokens 24 "The capital of France is"
    kill -INT $pid  # the cluster drains and stops its processes; a hung stop is killed after 30 s
    for _ in $(seq 30); do kill -0 $pid 2>/dev/null || break; sleep 1; done
    kill -KILL $pid 2>/dev/null
    wait $pid
}
spot fp8 PDSERVE_QUANTIZATION=fp8 PDSERVE_KV_CACHE_DTYPE=fp8
spot bf16 PDSERVE_QUANTIZATION=none
step colocated_fp8 60 python3 -c "
from common.sampling_params import SamplingParams
from engine.llm import LLM
llm = LLM('smollm2-135m', quantization='fp8', kv_cache_dtype='fp8', num_blocks=1024)
out = llm.generate(['The capital of France is'], SamplingParams(max_tokens=24, temperature=0.0), use_tqdm=False)[0]
print(repr(out.outputs[0].text))"

python3 - "$OUT" >>"$SUMMARY" 2>&1 <<'EOF'
import ast, json, pathlib, re, sys
out = pathlib.Path(sys.argv[1])
def load(name):
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None
def verdict(ok):
    return "met" if ok else "MISSED"
for workload, key, target in (("w1", "tpot_ms_p50", 3.2), ("w2", "ttft_ms_p50", 35.0)):
    for q in ("none", "fp8"):
        r = load(f"{workload}_{q}.json")
        if r is None:
            print(f"{workload} {q}: no result")
            continue
        figure, limits = r["engine"][key], r.get("limits", {})
        extra = {k: round(v, 3) for k, v in limits.items() if k in ("decode_floor_ms", "tpot_over_floor", "prefill_mfu")}
        goal = f" (target <= {target}: {verdict(figure <= target)})" if q == "fp8" else " (baseline)"
        print(f"{workload} {q} {r.get('device_name', '')}: {key} {figure:.2f} ms {extra}{goal}")
r = load("bench_fp8_gemv.json")
for name, row in (r or {}).get("shapes", {}).items():
    print(f"fp8 gemv {name} {row['n']}x{row['k']}: {row['fp8_us']:.1f} us = {row['fp8_pct_of_copy']:.0f}% of copy "
          f"(bf16 GEMV {row['bf16_pct_of_copy']:.0f}%); best {row['best']} {row['best_us']:.1f} us")
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
        print(f"w6 {dtype}: no result")
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
cluster = None if fp8_text is None else fp8_text.split("[finish_reason")[0].strip()
try:
    colocated = ast.literal_eval((out / "colocated_fp8.log").read_text().strip().splitlines()[-1]).strip()
except (OSError, IndexError, ValueError, SyntaxError):
    colocated = None
print(f"spot fp8 1P+1D cluster: {cluster!r}")
print(f"colocated fp8 engine:   {colocated!r} (same greedy text: {cluster is not None and cluster == colocated})")
if fp8_bytes and bf16_bytes:
    print(f"kv_transfer_bytes fp8 {fp8_bytes} / bf16 {bf16_bytes} = {fp8_bytes / bf16_bytes:.3f} (target 0.5)")
EOF
echo "total: $((SECONDS - START))s" | tee -a "$SUMMARY"
