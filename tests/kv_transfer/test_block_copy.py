"""The one-pass block copy of the cuda_ipc receiver (`kv_transfer.block_copy`): exact bytes with shuffled ids, in
Triton's interpreter on the CPU and on a GPU; its launcher's checks."""

from __future__ import annotations

import pytest
import torch

from common.errors import InvalidArgumentError
from kv_transfer.block_copy import TILE_WORDS, copy_blocks
from tests.engine.triton_interpreter import run_interpreted
from tests.kv_transfer.block_copy_checks import check_compile_for, check_copy_blocks, check_nothing_to_copy

QWEN3_8B_ROW_WORDS = 36 * 2 * 16 * 8 * 128 * 2 // 8  # one 16-token block of Qwen3-8B's bf16 KV, in 8-byte words


def test_kernel_in_triton_interpreter() -> None:
    run_interpreted("tests.kv_transfer.block_copy_checks", "run_interpreted_checks")


@pytest.mark.parametrize(
    ("src_shape", "dst_shape", "ids", "match"),
    [
        ((4, 8), (4, 16), (2, 2), "rows of one length"),
        ((4, 8), (4, 8), (2, 3), "one id list per side"),
    ],
)
def test_launcher_refuses_mismatched_shapes(
    src_shape: tuple[int, int], dst_shape: tuple[int, int], ids: tuple[int, int], match: str
) -> None:
    src, dst = torch.zeros(src_shape, dtype=torch.int64), torch.zeros(dst_shape, dtype=torch.int64)
    with pytest.raises(InvalidArgumentError, match=match):
        copy_blocks(src, torch.zeros(ids[0], dtype=torch.int64), dst, torch.zeros(ids[1], dtype=torch.int64))


def test_launcher_refuses_other_dtypes_and_strided_rows() -> None:
    rows, ids = torch.zeros(4, 8, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)
    with pytest.raises(InvalidArgumentError, match="one dtype"):
        copy_blocks(rows, ids, rows.to(torch.int32), ids)
    with pytest.raises(InvalidArgumentError, match="contiguous"):
        copy_blocks(torch.zeros(4, 16, dtype=torch.int64)[:, ::2], ids, rows, ids)
    with pytest.raises(InvalidArgumentError, match="int64 ids"):
        copy_blocks(rows, ids.int(), rows.clone(), ids.int())


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("row_words", "dtype"),
    [(QWEN3_8B_ROW_WORDS, torch.int64), (3 * TILE_WORDS + 100, torch.int64), (1001, torch.int16)],
    ids=["qwen3-8b-row", "partial-tile", "int16"],
)
def test_kernel_copies_exact_bytes_on_the_gpu(row_words: int, dtype: torch.dtype) -> None:
    check_copy_blocks(row_words, dtype, "cuda", seed=7, num_blocks=24)
    check_nothing_to_copy("cuda")
    check_compile_for("cuda")
