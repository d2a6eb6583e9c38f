"""Byte-level access to a KV pool: gather blocks out of it, and land received blocks in it.

A pool [num_blocks, ...] is viewed as uint8 [num_blocks, block_nbytes] sharing its memory, so one block is one row.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from common.errors import InvalidArgumentError


def pool_bytes(pool: torch.Tensor) -> torch.Tensor:
    """The contiguous pool as uint8 rows, one per block, sharing the pool's memory."""
    if not pool.is_contiguous():
        raise InvalidArgumentError("pool", "must be contiguous, so that each block is one run of bytes")
    return pool.view(torch.uint8).view(pool.shape[0], -1)


def check_block_ids(block_ids: Sequence[int], num_blocks: int, field: str) -> None:
    if not all(0 <= block_id < num_blocks for block_id in block_ids):
        raise InvalidArgumentError(field, f"block ids must be in [0, {num_blocks}), got {list(block_ids)}")


def gather_blocks(rows: torch.Tensor, block_ids: Sequence[int]) -> np.ndarray:
    """A host copy of the blocks' rows, C-contiguous uint8 [len(block_ids), block_nbytes]."""
    if rows.device.type == "cpu":
        # NOTE: numpy row indexing, not torch.index_select: measured 40-100x faster on CPU for whole-block rows.
        return rows.numpy()[list(block_ids)]
    index = torch.tensor(block_ids, dtype=torch.long, device=rows.device)
    return rows.index_select(0, index).cpu().numpy()


def write_blocks(rows: torch.Tensor, block_ids: Sequence[int], blocks: np.ndarray) -> None:
    """Copy host rows `blocks` into the pool's rows `block_ids`."""
    if rows.device.type == "cpu":
        rows.numpy()[list(block_ids)] = blocks
        return
    index = torch.tensor(block_ids, dtype=torch.long, device=rows.device)
    rows.index_copy_(0, index, torch.from_numpy(blocks).to(rows.device))


@dataclass(frozen=True, slots=True)
class BlockWrite:
    """Host buffers to receive a chunk's blocks into (one per block, in order), and what lands them in the pool."""

    buffers: list[memoryview]
    commit: Callable[[], None]


def _no_op() -> None:
    pass


class BlockSink(ABC):
    """Where a receiver reads chunks into; chosen once per pool by `make_block_sink`."""

    @abstractmethod
    def open(self, block_ids: Sequence[int]) -> BlockWrite: ...


class HostBlockSink(BlockSink):
    """A CPU pool: the buffers ARE the destination blocks' memory, so bytes land with no extra copy."""

    def __init__(self, rows: torch.Tensor) -> None:
        self._rows = rows.numpy()

    def open(self, block_ids: Sequence[int]) -> BlockWrite:
        return BlockWrite([self._rows[block_id].data for block_id in block_ids], _no_op)


class StagedBlockSink(BlockSink):
    """A device pool: bytes land in a host staging buffer, and commit copies it into the blocks."""

    def __init__(self, rows: torch.Tensor) -> None:
        self._rows = rows

    def open(self, block_ids: Sequence[int]) -> BlockWrite:
        staging = np.empty((len(block_ids), self._rows.shape[1]), dtype=np.uint8)
        buffers = [staging[i].data for i in range(len(block_ids))]
        return BlockWrite(buffers, lambda: write_blocks(self._rows, block_ids, staging))


def make_block_sink(rows: torch.Tensor) -> BlockSink:
    return HostBlockSink(rows) if rows.device.type == "cpu" else StagedBlockSink(rows)
