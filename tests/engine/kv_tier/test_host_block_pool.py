"""The host tier's slots: owned slots, the LRU of cached blocks, pins and events."""

from __future__ import annotations

from common.kv_cache_events import HOST_TIER, BlockRemoved, BlockStored
from engine.kv_tier.host_block_pool import HostBlockPool

H = [bytes([i]) * 16 for i in range(8)]


def test_allocate_evicts_least_recently_used_unpinned_blocks() -> None:
    pool = HostBlockPool(4)
    assert [pool.cache(H[i], (i,), None) for i in range(3)] == [0, 1, 2]
    assert pool.cache(H[0], (0,), None) is None  # already cached: now the most recently used
    pool.pin([H[1]])
    assert pool.allocate(2) == [2, 3]  # H[2] evicted (H[1] pinned, H[0] refreshed), and the free slot
    assert pool.allocate(2) is None
    assert (pool.num_free_slots, pool.num_cached) == (1, 2)
    pool.unpin([H[1]])
    assert pool.allocate(2) == [1, 0]  # H[0], then H[1] (the pin made it recently used)
    assert pool.take_events() == [
        BlockStored((H[0],), None, HOST_TIER),
        BlockStored((H[1],), None, HOST_TIER),
        BlockStored((H[2],), None, HOST_TIER),
        BlockRemoved((H[2],), HOST_TIER),
        BlockRemoved((H[0], H[1]), HOST_TIER),
    ]
    pool.free([3, 2, 1, 0])
    assert pool.num_free_slots == 4


def test_hits_are_verified_against_their_tokens() -> None:
    pool = HostBlockPool(2)
    pool.cache(H[0], (1, 2), None)
    assert pool.get_cached(H[0], [1, 3]) is None
    hit = pool.get_cached(H[0], [1, 2])
    assert hit is not None and hit.slot == 0


def test_reset_drops_cached_blocks_unless_pinned() -> None:
    pool = HostBlockPool(2)
    pool.cache(H[0], (1,), None)
    pool.pin([H[0]])
    assert not pool.reset()
    pool.unpin([H[0]])
    assert pool.reset()
    assert (pool.num_cached, pool.num_free_slots, pool.take_events()) == (0, 2, [])
