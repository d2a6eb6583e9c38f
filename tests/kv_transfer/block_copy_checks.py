"""Checks of the one-pass block copy (`kv_transfer.block_copy`), run on the GPU and, small, in Triton's interpreter."""

from __future__ import annotations

import torch

from kv_transfer.block_copy import TILE_WORDS, compile_for, copy_blocks


def random_rows(num_blocks: int, row_words: int, dtype: torch.dtype, device: str, seed: int) -> torch.Tensor:
    """Rows of random bits (NaN patterns included for a float view of them)."""
    generator = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**62), 2**62, (num_blocks, row_words), generator=generator, dtype=torch.int64)
    return bits.to(dtype).to(device)


def check_copy_blocks(
    row_words: int, dtype: torch.dtype, device: str, seed: int, tile: int = TILE_WORDS, num_blocks: int = 12
) -> None:
    """Shuffled, non-contiguous ids in both pools: exactly the named rows change, each to its source row's bits, and
    the source pool is untouched."""
    generator = torch.Generator().manual_seed(seed)
    src = random_rows(num_blocks, row_words, dtype, device, seed)
    dst = random_rows(num_blocks, row_words, dtype, device, seed + 1)
    src_before, dst_before = src.clone(), dst.clone()
    count = num_blocks // 2 + 1
    src_list = torch.randperm(num_blocks, generator=generator)[:count].tolist()
    dst_list = torch.randperm(num_blocks, generator=generator)[:count].tolist()
    src_ids = torch.tensor(src_list, dtype=torch.int64, device=device)
    dst_ids = torch.tensor(dst_list, dtype=torch.int64, device=device)

    copy_blocks(src, src_ids, dst, dst_ids, tile)

    want = dst_before.clone()
    want[dst_list] = src_before[src_list]
    assert torch.equal(dst.cpu(), want.cpu()), "copied rows differ from their sources, or other rows changed"
    assert torch.equal(src.cpu(), src_before.cpu())


def check_nothing_to_copy(device: str) -> None:
    dst = random_rows(3, 40, torch.int64, device, seed=5)
    before = dst.clone()
    none = torch.empty(0, dtype=torch.int64, device=device)
    copy_blocks(random_rows(3, 40, torch.int64, device, seed=6), none, dst, none)
    assert torch.equal(dst, before)


def check_compile_for(device: str) -> None:
    """Compiling on a scratch copy leaves the pool as it was."""
    rows = random_rows(4, 48, torch.int64, device, seed=8)
    before = rows.clone()
    compile_for(rows)
    assert torch.equal(rows, before)


def run_interpreted_checks() -> None:
    """Small CPU cases for the Triton interpreter (the process must start with TRITON_INTERPRET=1)."""
    check_copy_blocks(300, torch.int64, "cpu", seed=0, tile=128)  # 3 programs per row, the last 44 words
    check_copy_blocks(256, torch.int64, "cpu", seed=1, tile=128)  # whole tiles only
    check_copy_blocks(77, torch.int16, "cpu", seed=2, tile=64, num_blocks=7)  # odd rows of narrower words
    check_copy_blocks(40, torch.int64, "cpu", seed=3)  # one partial program of the default tile
    check_nothing_to_copy("cpu")
    check_compile_for("cpu")
