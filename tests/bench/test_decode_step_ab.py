"""bench/decode_step_ab.py's variant tables: the launchers read them once pointed at them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.decode_step_ab import write_variant_tables
from engine.attention import decode_tuning
from engine.layers import pdl


@pytest.fixture
def committed_tables(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(decode_tuning, "TABLE_PATH", decode_tuning.TABLE_PATH)
    monkeypatch.setattr(pdl, "TABLE_PATH", pdl.TABLE_PATH)
    yield
    decode_tuning.decode_launch.cache_clear()
    pdl.pdl_launches.cache_clear()


@pytest.mark.usefixtures("committed_tables")
def test_variant_tables_keep_the_tuned_tiles_and_set_the_knobs(tmp_path: Path) -> None:
    fp8_tiles = decode_tuning.decode_launch("float8_e4m3fn").tiles
    tuning_path, pdl_path = write_variant_tables(tmp_path, 512, True)
    decode_tuning.TABLE_PATH, pdl.TABLE_PATH = tuning_path, pdl_path
    decode_tuning.decode_launch.cache_clear()
    pdl.pdl_launches.cache_clear()
    assert decode_tuning.decode_launch("float8_e4m3fn").tiles == fp8_tiles
    assert decode_tuning.decode_launch("float8_e4m3fn").min_split_tokens == 512
    assert decode_tuning.decode_launch("bfloat16") == decode_tuning.DecodeLaunch(min_split_tokens=512)
    assert pdl.pdl_launches() == frozenset({"rms_norm", "qk_norm_rope_store", "decode_attention", "gemv"})
