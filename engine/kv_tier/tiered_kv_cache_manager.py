"""Prefix caching over two tiers: the device pool, and below it the host tier's LRU of evicted blocks.

A block's life across the tiers:
1. A cached device block the pool evicts (to reuse it) is first copied to a host slot kept under its hash
   (`HostBlockPool.cache`): the directory learns it left the device tier and entered the host tier.
2. `get_computed_blocks` finds the device prefix hits, then continues the run in the host tier; the request's
   computed tokens count both.
3. `allocate_slots` (the request's first) pins the host hits, allocates device blocks for them among its new
   blocks, copies them back and caches them on the device again: they are device hits for the next request.
The host slot stays cached too (a block may sit in both tiers), until the host LRU evicts it.
"""

from __future__ import annotations

from collections.abc import Sequence

from common.block_hash import BlockHash
from common.kv_cache_events import KVCacheEvent
from engine.block_pool import KVBlock
from engine.kv_cache_manager import KVCacheManager
from engine.kv_tier.block_copier import BlockCopier
from engine.kv_tier.host_block_pool import HostBlock, HostBlockPool


class TieredKVCacheManager(KVCacheManager):
    """A `KVCacheManager` whose evicted cached blocks move to the host tier, where prefix hits find them too."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        host: HostBlockPool,
        copier: BlockCopier,
        extra_keys: tuple[str, ...] = (),
    ) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching=True, extra_keys=extra_keys)
        self.host = host
        self.copier = copier
        self.block_pool.on_evict = self._offload
        self._host_hits: dict[str, list[tuple[BlockHash, HostBlock]]] = {}

    def get_computed_blocks(
        self, req_id: str, token_ids: Sequence[int], extra_keys: tuple[str, ...] | None = None
    ) -> tuple[list[KVBlock], int]:
        """The device prefix hits, and the tokens they and the host-tier hits that follow them cover."""
        computed, num_computed_tokens = super().get_computed_blocks(req_id, token_ids, extra_keys)
        block_hashes = self._block_hashes(req_id, token_ids, extra_keys)
        host_hits: list[tuple[BlockHash, HostBlock]] = []
        for i in range(len(computed), max(len(token_ids) - 1, 0) // self.block_size):
            start = i * self.block_size
            block = self.host.get_cached(block_hashes[i], token_ids[start : start + self.block_size])
            if block is None:
                break
            host_hits.append((block_hashes[i], block))
        if not host_hits:
            self._host_hits.pop(req_id, None)
            return computed, num_computed_tokens
        self._host_hits[req_id] = host_hits
        num_computed_tokens += len(host_hits) * self.block_size
        self._pending_lookups[req_id] = (len(token_ids), num_computed_tokens)
        return computed, num_computed_tokens

    def allocate_slots(self, req_id: str, num_tokens: int, computed_blocks: Sequence[KVBlock] = ()) -> list[int] | None:
        """As `KVCacheManager.allocate_slots`; on the first allocation the host hits of the last lookup are copied
        into the first new blocks, which are cached on the device."""
        host_hits = None if req_id in self._req_blocks else self._host_hits.pop(req_id, None)
        if not host_hits:
            return super().allocate_slots(req_id, num_tokens, computed_blocks)
        hashes = [block_hash for block_hash, _ in host_hits]
        # NOTE: allocating evicts device blocks into the host tier, which must not evict the hits being copied.
        self.host.pin(hashes)
        try:
            new_ids = super().allocate_slots(req_id, num_tokens, computed_blocks)
        finally:
            self.host.unpin(hashes)
        if new_ids is None:
            self._host_hits[req_id] = host_hits
            return None
        self.copier.to_device([block.slot for _, block in host_hits], new_ids[: len(host_hits)])
        self._cache_copied(req_id, host_hits)
        self.stats.host_hits += len(host_hits) * self.block_size
        return new_ids

    def free(self, req_id: str) -> None:
        self._host_hits.pop(req_id, None)
        super().free(req_id)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash of both tiers; False (nothing done) while any request holds blocks."""
        if not super().reset_prefix_cache():
            return False
        self.host.reset()
        return True

    def take_events(self) -> list[KVCacheEvent]:
        """Both tiers' cache events since the last call (each tier's in order)."""
        return super().take_events() + self.host.take_events()

    def _offload(self, block: KVBlock) -> None:
        assert block.block_hash is not None and block.token_ids is not None
        slot = self.host.cache(block.block_hash, block.token_ids, parent_block_hash=None)
        if slot is not None:
            self.copier.to_host([block.block_id], [slot])

    def _cache_copied(self, req_id: str, host_hits: list[tuple[BlockHash, HostBlock]]) -> None:
        """Cache the blocks the host hits were copied into, right after the request's device hits."""
        blocks = self._req_blocks[req_id]
        first = self._num_cached_blocks[req_id]
        for i, (block_hash, host_block) in enumerate(host_hits, start=first):
            parent = self._req_block_hashes[req_id][i - 1] if i > 0 else None
            self.block_pool.cache_full_block(blocks[i], block_hash, host_block.token_ids, parent_block_hash=parent)
        self._num_cached_blocks[req_id] = first + len(host_hits)
