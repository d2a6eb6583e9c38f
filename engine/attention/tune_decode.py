"""Tunes the decode kernel on an fp8 KV pool at batch 64 (Qwen3-8B head shape, one layer, CUDA-graph replays):
every tile shape (45) x split density (6), the fastest written to engine/attention/decode_tuning.json (other
dtypes' entries kept), the whole sweep to <out>/tune_fp8_attention.json. Contexts 1k and 8k are timed with the
winner as a check.

python3 -m engine.attention.tune_decode --out $OUT     (GPU only; about four minutes, compilation included)
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
from pathlib import Path
from typing import Any

import torch

from engine.attention.decode_tuning import TABLE_PATH
from engine.attention.triton_backend import num_kv_splits
from engine.attention.triton_decode import DecodeTiles
from engine.tuning.attention_steps import DEVICE, DTYPE, HKV, PAGE, decode_kernel_ms, kv_nbytes
from engine.tuning.limits import measure_limits
from engine.tuning.sweep import sweep_row

BATCH, CONTEXT = 64, 4096
KV_DTYPE = torch.float8_e4m3fn
TILES = [DecodeTiles(n, w, s) for n, w, s in itertools.product((64, 128, 256), (2, 4, 8), (2, 3, 4, 5, 6))]
PROGRAMS_PER_SM = (1, 2, 3, 4, 6, 8)


def time_launch(
    pool: torch.Tensor, context: int, tiles: DecodeTiles, programs_per_sm: int, num_sms: int, gen: torch.Generator
) -> dict[str, Any]:
    """One setting at batch 64 and this context: its split count, time and KV bytes per second."""
    splits = num_kv_splits(BATCH * HKV, context, num_sms, programs_per_sm)
    name = f"b={BATCH} ctx={context} {tiles} programs_per_sm={programs_per_sm} splits={splits}"
    fn = functools.partial(decode_kernel_ms, pool, [(context - 1, 1)] * BATCH, 1, splits, tiles, gen)
    row = sweep_row(name, fn, kv_nbytes(pool, BATCH * context))
    return row | {"tiles": tiles, "programs_per_sm": programs_per_sm}


def write_table(best: dict[str, Any]) -> dict[str, Any]:
    """The winner as the fp8 entry of the decode table (entries of other dtypes kept)."""
    table = json.loads(TABLE_PATH.read_text()) if TABLE_PATH.exists() else {}
    tiles = best["tiles"]
    table["float8_e4m3fn"] = {
        "block_n": tiles.block_n,
        "num_warps": tiles.num_warps,
        "num_stages": tiles.num_stages,
        "programs_per_sm": best["programs_per_sm"],
    }
    TABLE_PATH.write_text(json.dumps(table, indent=1) + "\n")
    return table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    limits = measure_limits(DTYPE)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(DEVICE).manual_seed(0)
    num_blocks = BATCH * 8192 // PAGE + 64
    pool = torch.randn(num_blocks, 2, 2, PAGE, HKV, 128, dtype=DTYPE, device=DEVICE, generator=gen).to(KV_DTYPE)
    rows = [time_launch(pool, CONTEXT, t, p, num_sms, gen) for t, p in itertools.product(TILES, PROGRAMS_PER_SM)]
    timed = [row for row in rows if "us" in row]
    best = min(timed, key=lambda row: row["us"])
    table = write_table(best)
    checks = [time_launch(pool, c, best["tiles"], best["programs_per_sm"], num_sms, gen) for c in (1024, 8192)]
    result = {
        "device": limits.device_name,
        "copy_gb_s": limits.copy_bandwidth_gb_s,
        "table": table,
        "best": best["name"],
        "best_pct_of_copy": 100 * best["gb_s"] / limits.copy_bandwidth_gb_s,
        "checks": checks,
        "sweep": rows,
    }
    (args.out / "tune_fp8_attention.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"best {best['name']}: {best['gb_s']:.0f} GB/s = {result['best_pct_of_copy']:.0f}% of copy", flush=True)


if __name__ == "__main__":
    main()
