"""Decode-kernel launch settings per KV-cache dtype, read from `decode_tuning.json` beside this file.

The table is written by engine/attention/tune_decode.py on the GPU (tiles and split density at batch 64 on the Qwen3-8B
head shape); a dtype it does not name, or a missing file, takes the defaults below (the bf16 kernel's settings).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

from engine.attention.triton_decode import DecodeTiles

TABLE_PATH = Path(__file__).with_name("decode_tuning.json")
# NOTE: splitting aims at this many programs per SM; each split costs a partial write and a reduce.
PROGRAMS_PER_SM = 2


@dataclass(slots=True, frozen=True)
class DecodeLaunch:
    """The decode kernel's tiles and how many programs per SM its split count aims at."""

    tiles: DecodeTiles = field(default_factory=DecodeTiles)
    programs_per_sm: int = PROGRAMS_PER_SM


@functools.cache
def decode_launch(kv_dtype_name: str) -> DecodeLaunch:
    """The table's entry for a KV dtype (`str(torch dtype)` without `torch.`), else the defaults."""
    try:
        entry = json.loads(TABLE_PATH.read_text()).get(kv_dtype_name)
    except FileNotFoundError:
        entry = None
    if entry is None:
        return DecodeLaunch()
    tiles = DecodeTiles(entry["block_n"], entry["num_warps"], entry["num_stages"])
    return DecodeLaunch(tiles, entry["programs_per_sm"])
