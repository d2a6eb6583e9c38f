"""The paged KV pool's bookkeeping: block ids, ref counts, an LRU free queue and the prefix cache map.

No tensors here: a block id indexes the first dimension of the KV pool tensor. A free block keeps
its hash (lazy eviction), so it can be revived by a prefix hit until `get_new_blocks` reuses it.
Invariants:
- a block is in the free queue exactly when its ref_cnt is 0;
- a block carries a hash exactly when the cache map points that hash at it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from common.block_hash import BlockHash
from common.kv_cache_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent


@dataclass(slots=True, eq=False)
class KVBlock:
    """One KV block: its id, how many requests hold it, and its cache identity once full."""

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    token_ids: tuple[int, ...] | None = None
    prev_free: KVBlock | None = field(default=None, repr=False)
    next_free: KVBlock | None = field(default=None, repr=False)


class FreeBlockQueue:
    """Doubly linked list of free blocks: head is least recently freed (evicted first), O(1) ops."""

    def __init__(self, blocks: Sequence[KVBlock]) -> None:
        # NOTE: sentinels at both ends, so every queued block has both links and no branch is needed.
        self._head = KVBlock(block_id=-1)
        self._tail = KVBlock(block_id=-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVBlock:
        """Remove and return the block at the head (the eviction end)."""
        block = self._head.next_free
        if block is None or block is self._tail:
            raise IndexError("pop from an empty free block queue")
        self.remove(block)
        return block

    def append(self, block: KVBlock) -> None:
        """Put a block at the tail (most recently freed)."""
        if block.prev_free is not None or block.next_free is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        last = self._tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def remove(self, block: KVBlock) -> None:
        """Take a block out of the queue, wherever it is."""
        prev_block, next_block = block.prev_free, block.next_free
        if prev_block is None or next_block is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        prev_block.next_free = next_block
        next_block.prev_free = prev_block
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def block_ids(self) -> list[int]:
        """Ids from head to tail (for tests and debugging; O(n))."""
        ids: list[int] = []
        block = self._head.next_free
        while block is not None and block is not self._tail:
            ids.append(block.block_id)
            block = block.next_free
        return ids


class BlockPool:
    """All KV blocks of one pool, the free queue, and the hash -> block map of cached full blocks."""

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be > 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(block_id=i) for i in range(num_blocks)]
        self._free_queue = FreeBlockQueue(self.blocks)
        self._cached: dict[BlockHash, KVBlock] = {}
        self._events: list[KVCacheEvent] = []
        # NOTE: called with each cached block about to be evicted, its hash and tokens still set (the host tier).
        self.on_evict: Callable[[KVBlock], None] | None = None

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds, cached ones included (they are evictable)."""
        return self._free_queue.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks held by at least one request."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def free_block_ids(self) -> list[int]:
        """Free block ids in eviction order (for tests and debugging; O(n))."""
        return self._free_queue.block_ids()

    def get_new_blocks(self, num_blocks: int) -> list[KVBlock]:
        """Take `num_blocks` blocks from the LRU end, evicting their cached hashes; each gets ref_cnt 1."""
        if not 0 <= num_blocks <= self.num_free_blocks:
            raise ValueError(f"cannot allocate {num_blocks} blocks, {self.num_free_blocks} free")
        evicted: list[BlockHash] = []
        blocks: list[KVBlock] = []
        for _ in range(num_blocks):
            block = self._free_queue.popleft()
            if block.block_hash is not None:
                if self.on_evict is not None:
                    self.on_evict(block)
                evicted.append(block.block_hash)
                del self._cached[block.block_hash]
                block.block_hash = None
                block.token_ids = None
            block.ref_cnt = 1
            blocks.append(block)
        if evicted:
            self._events.append(BlockRemoved(tuple(evicted)))
        return blocks

    def get_cached_block(self, block_hash: BlockHash, token_ids: Sequence[int]) -> KVBlock | None:
        """The block cached under `block_hash` if its stored tokens equal `token_ids`, else None."""
        block = self._cached.get(block_hash)
        if block is None or block.token_ids != tuple(token_ids):
            return None
        return block

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Add a reference to each block; a free (cached) block leaves the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self._free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, blocks: Iterable[KVBlock]) -> None:
        """Drop a reference from each block; those reaching 0 join the free queue tail in the order given."""
        for block in blocks:
            if block.ref_cnt <= 0:
                raise ValueError(f"block {block.block_id} freed with ref_cnt {block.ref_cnt}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free_queue.append(block)

    def cache_full_block(
        self,
        block: KVBlock,
        block_hash: BlockHash,
        token_ids: Sequence[int],
        parent_block_hash: BlockHash | None = None,
    ) -> None:
        """Cache a full, computed block under `block_hash`.

        `parent_block_hash` is the previous block's hash in the request's chain (None for the first
        block); it lets consecutive stores of one chain share a single `BlockStored` event. A hash
        already cached by another block leaves this block uncached: the map holds one block per hash.
        """
        if not self.enable_caching or block_hash in self._cached:
            return
        if block.block_hash is not None:
            raise ValueError(f"block {block.block_id} is already cached")
        block.block_hash = block_hash
        block.token_ids = tuple(token_ids)
        self._cached[block_hash] = block
        self._record_stored(block_hash, parent_block_hash)

    def _record_stored(self, block_hash: BlockHash, parent_block_hash: BlockHash | None) -> None:
        last = self._events[-1] if self._events else None
        if (
            isinstance(last, BlockStored)
            and parent_block_hash is not None
            and last.block_hashes[-1] == parent_block_hash
        ):
            self._events[-1] = BlockStored((*last.block_hashes, block_hash), last.parent_block_hash)
        else:
            self._events.append(BlockStored((block_hash,), parent_block_hash))

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash; refused (False) while any block is held by a request."""
        if self.num_free_blocks != self.num_blocks:
            return False
        for block in self._cached.values():
            block.block_hash = None
            block.token_ids = None
        self._cached.clear()
        if self.enable_caching:
            self._events.append(AllBlocksCleared())
        return True

    def take_events(self) -> list[KVCacheEvent]:
        """Return and clear the events recorded since the last call, oldest first."""
        events, self._events = self._events, []
        return events
