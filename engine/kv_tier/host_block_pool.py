"""The host tier's bookkeeping: slots of host memory, each holding one KV block, shared by two users.

- Swap: a preempted request's blocks are copied into slots it owns (`allocate`) until it resumes (`free`).
- Prefix tier: a cached block evicted from the device pool is copied into a slot kept under its block hash in an
  LRU (`cache`); a later prefix hit there (`get_cached`) is copied back to the device instead of recomputed.

No tensors here: a slot id indexes the first dimension of the host KV tensor (`HostKVCopier`). `allocate` evicts
cached slots from the LRU end when no slot is free; a pinned cached slot (`pin`, a hit about to be copied back) is
never evicted. Cache changes are recorded as events of tier `host` for the prefix directory.
Invariants: a slot is free, owned by one swapped request, or cached under exactly one hash.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from common.block_hash import BlockHash
from common.kv_cache_events import HOST_TIER, BlockRemoved, BlockStored, KVCacheEvent


@dataclass(slots=True)
class HostBlock:
    """A cached host slot: the block's tokens (a hit is verified against them) and its pin count."""

    slot: int
    token_ids: tuple[int, ...]
    num_pins: int = 0


class HostBlockPool:
    """`num_slots` host slots: a free list, and an LRU of cached blocks by hash (oldest first)."""

    def __init__(self, num_slots: int) -> None:
        if num_slots <= 0:
            raise ValueError(f"num_slots must be > 0, got {num_slots}")
        self.num_slots = num_slots
        self._free: list[int] = list(range(num_slots - 1, -1, -1))
        self._cached: OrderedDict[BlockHash, HostBlock] = OrderedDict()
        self._num_pinned = 0
        """Cached blocks with a pin (num_pins > 0)."""
        self._events: list[KVCacheEvent] = []

    @property
    def num_free_slots(self) -> int:
        """Slots not owned by a swapped request: free ones and unpinned cached ones (evictable)."""
        return len(self._free) + len(self._cached) - self._num_pinned

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def num_owned_slots(self) -> int:
        """Slots owned by swapped requests."""
        return self.num_slots - len(self._free) - len(self._cached)

    def can_allocate(self, num_slots: int) -> bool:
        return num_slots <= len(self._free) or num_slots <= self.num_free_slots

    def allocate(self, num_slots: int) -> list[int] | None:
        """`num_slots` slots for the caller to own, evicting least recently used cached blocks if needed; None
        (nothing changed) when even evicting every unpinned cached block is not enough."""
        if not self.can_allocate(num_slots):
            return None
        evicted: list[BlockHash] = []
        while len(self._free) < num_slots:
            block_hash = next(h for h, block in self._cached.items() if not block.num_pins)
            self._free.append(self._cached.pop(block_hash).slot)
            evicted.append(block_hash)
        if evicted:
            self._events.append(BlockRemoved(tuple(evicted), HOST_TIER))
        return [self._free.pop() for _ in range(num_slots)]

    def free(self, slots: Iterable[int]) -> None:
        """Give back owned slots."""
        self._free.extend(slots)

    def cache(self, block_hash: BlockHash, token_ids: Sequence[int], parent_block_hash: BlockHash | None) -> int | None:
        """A slot for a block evicted from the device under `block_hash`, now the most recently used; None when the
        hash is cached already (its slot is refreshed instead) or no slot can be had."""
        block = self._cached.get(block_hash)
        if block is not None:
            self._cached.move_to_end(block_hash)
            return None
        slots = self.allocate(1)
        if slots is None:
            return None
        self._cached[block_hash] = HostBlock(slots[0], tuple(token_ids))
        self._events.append(BlockStored((block_hash,), parent_block_hash, HOST_TIER))
        return slots[0]

    def get_cached(self, block_hash: BlockHash, token_ids: Sequence[int]) -> HostBlock | None:
        """The block cached under `block_hash` if its tokens equal `token_ids` (the LRU order is not changed)."""
        block = self._cached.get(block_hash)
        if block is None or block.token_ids != tuple(token_ids):
            return None
        return block

    def pin(self, block_hashes: Iterable[BlockHash]) -> None:
        """Keep these cached blocks from eviction (a hit about to be copied back) and mark them recently used."""
        for block_hash in block_hashes:
            block = self._cached[block_hash]
            if block.num_pins == 0:
                self._num_pinned += 1
            block.num_pins += 1
            self._cached.move_to_end(block_hash)

    def unpin(self, block_hashes: Iterable[BlockHash]) -> None:
        for block_hash in block_hashes:
            block = self._cached[block_hash]
            block.num_pins -= 1
            if block.num_pins == 0:
                self._num_pinned -= 1

    def reset(self) -> bool:
        """Drop every cached block and the events not yet taken (an `AllBlocksCleared` of the device pool covers
        both tiers); refused (False) while a hit is pinned."""
        if self._num_pinned:
            return False
        self._free.extend(block.slot for block in self._cached.values())
        self._cached.clear()
        self._events.clear()
        return True

    def take_events(self) -> list[KVCacheEvent]:
        """Return and clear the events recorded since the last call, oldest first."""
        events, self._events = self._events, []
        return events
