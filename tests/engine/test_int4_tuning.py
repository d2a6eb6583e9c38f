"""Which int4 kernel runs a layer: row buckets, the tuned table's entries by (N, K, bucket), the heuristic else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.layers.quant import int4_tuning
from engine.layers.quant.int4_tuning import Int4Config, heuristic_config, row_bucket, table_key, tuned_table


def test_rows_go_to_the_smallest_bucket_that_holds_them() -> None:
    assert [row_bucket(m) for m in (1, 2, 3, 5, 16, 17, 65, 256, 257, 4096)] == [
        1,
        2,
        4,
        8,
        16,
        64,
        256,
        256,
        2048,
        2048,
    ]


def test_table_entries_win_over_the_heuristic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gemm = Int4Config("gemm", {"BLOCK_M": 16, "BLOCK_N": 64, "GROUPS": 2, "GROUP_M": 8})
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"device": "x", "entries": {table_key(4096, 4096, 4): gemm.to_json()}}))
    monkeypatch.setattr(int4_tuning, "tuned_table", lambda: tuned_table(path))
    assert int4_tuning.config_for(4096, 4096, 3) == gemm
    assert int4_tuning.config_for(4096, 4096, 2) == heuristic_config(4096, 4096, 2)
    assert int4_tuning.config_for(4096, 12288, 3) == heuristic_config(4096, 12288, 3)


def test_heuristic_splits_k_until_512_programs_and_picks_the_kernel_by_rows() -> None:
    assert heuristic_config(4096, 12288, 1).meta["SPLIT_K"] == 2  # 256 row tiles, 96 groups
    assert heuristic_config(24576, 4096, 1).meta["SPLIT_K"] == 1
    assert heuristic_config(256, 256, 1).meta["SPLIT_K"] == 1  # 2 groups: no split of a 4-group step
    assert [heuristic_config(4096, 4096, m).kernel for m in (4, 5, 256, 257)] == ["gemv", "gemm", "gemm", "dequant"]


def test_an_unknown_kernel_is_refused() -> None:
    with pytest.raises(ValueError, match="kernel 'marlin'"):
        Int4Config.from_json({"kernel": "marlin", "meta": {}})
