"""Copies of whole KV blocks between the device pool and the host tier's tensor.

Every copy is enqueued on the device's current stream in the order the scheduler decides it, before the step that
reuses the blocks is enqueued: a block leaves for the host after the steps that wrote it, and a block comes back
before the step that reads it, with no synchronization (the host tensor is pinned on CUDA, so copies are
asynchronous; the host never reads it). On CPU the copies are plain memory copies.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class HostKVCopier:
    """A host tensor of `num_slots` blocks shaped like the device pool's blocks, and the copies both ways (a
    `BlockCopier`)."""

    def __init__(self, device_pool: torch.Tensor, num_slots: int) -> None:
        self.device_pool = device_pool
        pin = device_pool.device.type == "cuda"
        self.host_pool = torch.empty(
            (num_slots, *device_pool.shape[1:]), dtype=device_pool.dtype, device="cpu", pin_memory=pin
        )
        self._non_blocking = pin

    @staticmethod
    def num_slots(device_pool: torch.Tensor, swap_space_gib: float) -> int:
        """How many of the pool's blocks fit in `swap_space_gib` of host memory."""
        block_nbytes = device_pool[0].numel() * device_pool.element_size()
        return int(swap_space_gib * 2**30) // block_nbytes

    def to_host(self, block_ids: Sequence[int], slots: Sequence[int]) -> None:
        # NOTE: one copy per block: a block is contiguous over all layers (the pool's layout), the index lists are
        # short, and a gather would cost a device temporary.
        for block_id, slot in zip(block_ids, slots, strict=True):
            self.host_pool[slot].copy_(self.device_pool[block_id], non_blocking=self._non_blocking)

    def to_device(self, slots: Sequence[int], block_ids: Sequence[int]) -> None:
        for slot, block_id in zip(slots, block_ids, strict=True):
            self.device_pool[block_id].copy_(self.host_pool[slot], non_blocking=self._non_blocking)
