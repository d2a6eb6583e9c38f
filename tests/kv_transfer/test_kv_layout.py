"""KVLayout: sizes, reading a pool's layout, and naming what differs."""

from __future__ import annotations

import pytest
import torch

from common.errors import InvalidArgumentError
from kv_transfer import KVLayout, LayoutMismatchError


def test_block_nbytes_counts_k_and_v_of_every_layer() -> None:
    assert KVLayout("float32", 16, 30, 3, 64).block_nbytes == 30 * 2 * 16 * 3 * 64 * 4 == 737_280
    assert KVLayout("bfloat16", 16, 30, 3, 64).block_nbytes == 368_640


def test_from_pool_reads_the_pool_shape_and_dtype() -> None:
    pool = torch.zeros(10, 3, 2, 8, 4, 32, dtype=torch.bfloat16)
    layout = KVLayout.from_pool(pool, 8)
    assert layout == KVLayout("bfloat16", 8, 3, 4, 32)
    assert layout.block_nbytes == pool[0].numel() * 2


@pytest.mark.parametrize(
    ("pool", "block_size", "field"),
    [
        (torch.zeros(10, 3, 2, 8, 4), 8, "pool"),
        (torch.zeros(10, 3, 3, 8, 4, 32), 8, "pool"),
        (torch.zeros(10, 3, 2, 8, 4, 32), 16, "block_size"),
        (torch.zeros(10, 3, 2, 8, 4, 32).transpose(0, 1), 8, "pool"),
    ],
)
def test_from_pool_rejects_other_shapes(pool: torch.Tensor, block_size: int, field: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        KVLayout.from_pool(pool, block_size)
    assert raised.value.field == field


def test_check_compatible_names_every_differing_field() -> None:
    ours = KVLayout("float32", 16, 30, 3, 64)
    ours.check_compatible(KVLayout("float32", 16, 30, 3, 64))
    with pytest.raises(LayoutMismatchError) as raised:
        ours.check_compatible(KVLayout("bfloat16", 16, 30, 3, 128))
    assert raised.value.fields == ("dtype", "head_dim")
    assert "dtype: 'float32' vs 'bfloat16'" in str(raised.value)
    assert "head_dim: 64 vs 128" in str(raised.value)


def test_dict_round_trip_and_validation() -> None:
    layout = KVLayout("float16", 16, 2, 1, 8)
    assert layout.to_dict() == {
        "dtype": "float16",
        "block_size": 16,
        "num_layers": 2,
        "num_kv_heads": 1,
        "head_dim": 8,
        "k_scale": 1.0,
        "v_scale": 1.0,
        "tp_rank": 0,
        "tp_size": 1,
        "pp_rank": 0,
        "pp_size": 1,
    }
    assert KVLayout.from_dict(layout.to_dict()) == layout
    with pytest.raises(InvalidArgumentError, match="layout"):
        KVLayout.from_dict({"dtype": "float16"})
    with pytest.raises(InvalidArgumentError, match="dtype"):
        KVLayout("float99", 16, 2, 1, 8)
    with pytest.raises(InvalidArgumentError, match="num_layers"):
        KVLayout("float16", 16, 0, 1, 8)
