"""What the host tier's bookkeeping needs of the device: block copies, by id (no tensors on this side)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class BlockCopier(Protocol):
    def to_host(self, block_ids: Sequence[int], slots: Sequence[int]) -> None:
        """Copy device blocks `block_ids` into host slots `slots`, pairwise, after every step enqueued so far."""
        ...

    def to_device(self, slots: Sequence[int], block_ids: Sequence[int]) -> None:
        """Copy host slots into device blocks, pairwise, before any step enqueued from now on."""
        ...
