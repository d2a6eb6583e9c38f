"""How the nccl backend cuts a chunk into pieces: one NCCL send and receive each, so that the sender's gather of one
piece, the transfer of the one before and the receiver's scatter of the one before that all run at once.

NOTE: a chunk of 2048 tokens of Qwen3-8B's KV is 302 MB. Gathered whole, sent whole and scattered whole, its two
local passes (~0.2 ms each at HBM speed) add to the ~0.9 ms of NVLink; in pieces of ~32 MB only the first piece's
gather and the last one's scatter do, ~20 us each, while each NCCL send stays large enough to run at full rate.
"""

from __future__ import annotations

from common.errors import InvalidArgumentError

PIECE_NBYTES = 32 << 20


def piece_blocks(piece_nbytes: int, block_nbytes: int) -> int:
    """Whole blocks per piece: as many as fit in `piece_nbytes`, at least one."""
    if piece_nbytes <= 0 or block_nbytes <= 0:
        raise InvalidArgumentError("piece_nbytes", f"pieces and blocks have bytes, got {piece_nbytes}, {block_nbytes}")
    return max(1, piece_nbytes // block_nbytes)


def piece_bounds(num_blocks: int, blocks_per_piece: int) -> list[tuple[int, int]]:
    """[start, stop) of each piece of a chunk of `num_blocks` blocks, in order; the last one may be shorter."""
    return [(start, min(start + blocks_per_piece, num_blocks)) for start in range(0, num_blocks, blocks_per_piece)]
