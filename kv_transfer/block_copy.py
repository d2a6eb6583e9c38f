# mypy: allow-untyped-defs, disable-error-code="import-untyped,import-not-found"
"""One-pass block copy between two pools' rows on one GPU: `dst_rows[dst_ids[i]] = src_rows[src_ids[i]]`.

The cuda_ipc receiver lands a chunk with it, reading the sender's pool where it is mapped: on the receiver's own GPU,
or on another one over NVLink (peer access). Each program copies one tile of one block's row, so every byte is read
once and written once, with as many tiles in flight as the GPU holds; a torch gather then scatter reads and writes
the chunk twice, through a temporary.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from common.errors import InvalidArgumentError

# NOTE: 4096 words of 8 bytes (32 KiB) per program, 8 warps: each thread keeps 8 loads of 16 bytes in flight, which
# a read over NVLink (microseconds away) needs to stream; a row of Qwen3-8B's KV (2.36 MB) is 72 programs.
TILE_WORDS = 4096
_NUM_WARPS = 8


# NOTE: `row_words` stays specialized (its divisibility by 16 lets the loads be 16 bytes wide); `num_tiles` is not
# (a one-tile row would compile a variant of its own).
@triton.jit(do_not_specialize=["num_tiles"])
def _copy_blocks_kernel(src, dst, src_ids, dst_ids, row_words, num_tiles, TILE: tl.constexpr):
    pid = tl.program_id(0)
    block = pid // num_tiles
    offsets = (pid % num_tiles) * TILE + tl.arange(0, TILE)
    mask = offsets < row_words
    src_row = tl.load(src_ids + block).to(tl.int64) * row_words
    dst_row = tl.load(dst_ids + block).to(tl.int64) * row_words
    words = tl.load(src + src_row + offsets, mask=mask)
    tl.store(dst + dst_row + offsets, words, mask=mask)


def copy_blocks(
    src_rows: torch.Tensor, src_ids: torch.Tensor, dst_rows: torch.Tensor, dst_ids: torch.Tensor, tile: int = TILE_WORDS
) -> None:
    """Copy row `src_ids[i]` of `src_rows` to row `dst_ids[i]` of `dst_rows`, for every i, on the current stream of
    `dst_rows`' device. Rows are contiguous [num_blocks, row_words] of one dtype and length (`pool_io.row_words`);
    the ids are int64 on that device, in range (the callers check them on the host), and name distinct
    destination rows. `src_rows` may live on another GPU, mapped on this one.
    """
    if src_rows.dim() != 2 or dst_rows.dim() != 2 or src_rows.shape[1] != dst_rows.shape[1]:
        raise InvalidArgumentError(
            "src_rows", f"rows of one length, got {tuple(src_rows.shape)} {tuple(dst_rows.shape)}"
        )
    if src_rows.dtype != dst_rows.dtype:
        raise InvalidArgumentError("src_rows", f"one dtype, got {src_rows.dtype} and {dst_rows.dtype}")
    if not (src_rows.is_contiguous() and dst_rows.is_contiguous()):
        raise InvalidArgumentError("src_rows", "both pools' rows must be contiguous")
    if src_ids.shape != dst_ids.shape or src_ids.dim() != 1:
        raise InvalidArgumentError(
            "dst_ids", f"one id list per side, got {tuple(src_ids.shape)} {tuple(dst_ids.shape)}"
        )
    if src_ids.dtype != torch.int64 or dst_ids.dtype != torch.int64:
        raise InvalidArgumentError("src_ids", f"int64 ids, got {src_ids.dtype} and {dst_ids.dtype}")
    if not (src_rows.device == src_ids.device == dst_ids.device == dst_rows.device):
        raise InvalidArgumentError("src_rows", "rows and ids must be on one device (a peer pool mapped on it)")
    row_words = dst_rows.shape[1]
    num_tiles = triton.cdiv(row_words, tile)
    if src_ids.numel() == 0 or row_words == 0:
        return
    with torch.cuda.device(dst_rows.device) if dst_rows.is_cuda else contextlib.nullcontext():
        _copy_blocks_kernel[(src_ids.numel() * num_tiles,)](
            src_rows, dst_rows, src_ids, dst_ids, row_words, num_tiles, TILE=tile, num_warps=_NUM_WARPS
        )


def compile_for(rows: torch.Tensor) -> None:
    """Compile the kernel for `rows` (their dtype and length, on their device) now, on two scratch rows, so that the
    first chunk does not wait for Triton (about a second on a fresh machine)."""
    scratch = torch.zeros((2, rows.shape[1]), dtype=rows.dtype, device=rows.device)
    ids = torch.tensor([0], dtype=torch.int64, device=rows.device)
    copy_blocks(scratch, ids, scratch, ids + 1)
