"""A `BlockCopier` over dicts: what each device block and host slot holds, and every copy, in order."""

from __future__ import annotations

from collections.abc import Sequence


class FakeCopier:
    def __init__(self) -> None:
        self.device: dict[int, object] = {}
        self.host: dict[int, object] = {}
        self.copies: list[tuple[str, list[int], list[int]]] = []

    def to_host(self, block_ids: Sequence[int], slots: Sequence[int]) -> None:
        self.copies.append(("to_host", list(block_ids), list(slots)))
        for block_id, slot in zip(block_ids, slots, strict=True):
            self.host[slot] = self.device.get(block_id)

    def to_device(self, slots: Sequence[int], block_ids: Sequence[int]) -> None:
        self.copies.append(("to_device", list(slots), list(block_ids)))
        for slot, block_id in zip(slots, block_ids, strict=True):
            self.device[block_id] = self.host.get(slot)
