"""Which int4 kernel and tile run a layer [N, K] at M rows: the tuned table (engine/layers/quant/int4_tuned.json,
written on the GPU by engine/layers/quant/tune_int4.py, keyed by (N, K, rows bucket)), else a heuristic.

Kernels (engine.layers.quant.triton_int4): "gemv" (one activation row per program column, split-K partial sums
reduced by a second pass; meta HALF2=1 dequantizes and multiplies in packed bf16/fp16 pairs, absent or 0 in
float32: the heuristic keeps float32, only the sweep, which checks each candidate's output, picks HALF2), "gemm"
(a dequantize-in-GEMM, 128*GROUPS channels per tl.dot), "dequant" (the whole weight dequantized to the
activation dtype in a scratch buffer, then cuBLAS: prefill is compute-bound, and the extra pass costs ~2.5 bytes
per weight).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

KERNELS = ("gemv", "gemm", "dequant")
ROW_BUCKETS = (1, 2, 4, 8, 16, 64, 256, 2048)
TABLE_PATH = Path(__file__).with_name("int4_tuned.json")


@dataclass(frozen=True, slots=True)
class Int4Config:
    """A kernel and its launch parameters (the Triton meta-parameters, num_warps and num_stages included)."""

    kernel: str
    meta: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel {self.kernel!r} is not one of {KERNELS}")

    def to_json(self) -> dict[str, object]:
        return {"kernel": self.kernel, "meta": self.meta}

    @classmethod
    def from_json(cls, entry: dict[str, object]) -> Int4Config:
        meta = entry.get("meta", {})
        if not isinstance(meta, dict):
            raise ValueError(f"int4 table entry meta {meta!r} is not an object")
        return cls(str(entry["kernel"]), {str(k): int(v) for k, v in meta.items()})


def row_bucket(num_rows: int) -> int:
    """The smallest bucket holding num_rows (the largest one beyond it)."""
    return next((b for b in ROW_BUCKETS if num_rows <= b), ROW_BUCKETS[-1])


def table_key(n: int, k: int, bucket: int) -> str:
    return f"{n}x{k}x{bucket}"


@functools.cache
def tuned_table(path: Path = TABLE_PATH) -> dict[str, Int4Config]:
    """The committed table's entries (empty before the GPU sweep's table is committed)."""
    entries = json.loads(path.read_text())["entries"] if path.exists() else {}
    return {key: Int4Config.from_json(entry) for key, entry in entries.items()}


def heuristic_config(n: int, k: int, num_rows: int) -> Int4Config:
    """Untuned shapes: the GEMV up to 4 rows, split over K until ~512 programs share the weight; the GEMM up to
    256 rows; beyond, dequantize + cuBLAS."""
    if num_rows <= 4:
        block_n = 16
        programs = -(-n // block_n)
        split_k = 1
        while programs * split_k < 512 and split_k * 2 * 4 <= k // 128:
            split_k *= 2
        return Int4Config(
            "gemv", {"BLOCK_N": block_n, "GROUPS": 4, "SPLIT_K": split_k, "num_warps": 4, "num_stages": 2}
        )
    if num_rows <= 256:
        block_m = 16 if num_rows <= 16 else 64
        return Int4Config(
            "gemm", {"BLOCK_M": block_m, "BLOCK_N": 64, "GROUPS": 1, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}
        )
    return Int4Config("dequant", {"BLOCK_N": 16, "GROUPS": 4, "num_warps": 4, "num_stages": 1})


def config_for(n: int, k: int, num_rows: int) -> Int4Config:
    """The tuned table's entry for (n, k, bucket of num_rows), else `heuristic_config`."""
    tuned = tuned_table().get(table_key(n, k, row_bucket(num_rows)))
    return tuned if tuned is not None else heuristic_config(n, k, num_rows)
