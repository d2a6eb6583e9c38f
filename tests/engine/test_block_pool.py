from __future__ import annotations

import pytest

from common.block_hash import hash_block_tokens
from common.kv_cache_events import AllBlocksCleared, BlockRemoved, BlockStored
from engine.block_pool import BlockPool, FreeBlockQueue, KVBlock


def _hash(tag: int) -> bytes:
    return hash_block_tokens(None, [tag])


def test_free_queue_order_after_popleft_remove_append() -> None:
    blocks = [KVBlock(block_id=i) for i in range(5)]
    queue = FreeBlockQueue(blocks)
    assert queue.block_ids() == [0, 1, 2, 3, 4]
    assert queue.popleft() is blocks[0]
    queue.remove(blocks[2])
    assert queue.block_ids() == [1, 3, 4]
    queue.append(blocks[0])
    queue.append(blocks[2])
    assert queue.block_ids() == [1, 3, 4, 0, 2]
    queue.remove(blocks[2])
    queue.remove(blocks[1])
    assert queue.block_ids() == [3, 4, 0]
    assert queue.num_free_blocks == 3


def test_free_queue_rejects_bad_operations() -> None:
    blocks = [KVBlock(block_id=i) for i in range(2)]
    queue = FreeBlockQueue(blocks)
    with pytest.raises(ValueError):
        queue.append(blocks[0])
    queue.remove(blocks[0])
    with pytest.raises(ValueError):
        queue.remove(blocks[0])
    queue.popleft()
    with pytest.raises(IndexError):
        queue.popleft()
    assert queue.num_free_blocks == 0


def test_get_new_blocks_in_order_with_ref_cnt_one() -> None:
    pool = BlockPool(num_blocks=6, enable_caching=True)
    first = pool.get_new_blocks(3)
    second = pool.get_new_blocks(2)
    assert [b.block_id for b in first] == [0, 1, 2]
    assert [b.block_id for b in second] == [3, 4]
    assert [b.ref_cnt for b in first + second] == [1, 1, 1, 1, 1]
    assert pool.num_free_blocks == 1
    assert pool.usage == pytest.approx(5 / 6)
    with pytest.raises(ValueError):
        pool.get_new_blocks(2)
    assert pool.num_free_blocks == 1


def test_touch_and_free_ref_counts() -> None:
    pool = BlockPool(num_blocks=4, enable_caching=True)
    blocks = pool.get_new_blocks(2)
    pool.touch(blocks)
    assert [b.ref_cnt for b in blocks] == [2, 2]
    pool.free_blocks(blocks)
    assert [b.ref_cnt for b in blocks] == [1, 1]
    assert pool.free_block_ids() == [2, 3]
    pool.free_blocks(blocks)
    assert [b.ref_cnt for b in blocks] == [0, 0]
    assert pool.free_block_ids() == [2, 3, 0, 1]
    with pytest.raises(ValueError):
        pool.free_blocks([blocks[0]])


def test_eviction_order_and_removed_events() -> None:
    pool = BlockPool(num_blocks=6, enable_caching=True)
    req_a = pool.get_new_blocks(3)
    req_b = pool.get_new_blocks(3)
    for block in req_a + req_b:
        pool.cache_full_block(block, _hash(block.block_id), [block.block_id])
    pool.take_events()
    # Each request frees tail first; request b finishes before request a.
    pool.free_blocks(reversed(req_b))
    pool.free_blocks(reversed(req_a))
    assert pool.free_block_ids() == [5, 4, 3, 2, 1, 0]

    got = pool.get_new_blocks(4)

    assert [b.block_id for b in got] == [5, 4, 3, 2]
    assert all(b.block_hash is None and b.token_ids is None for b in got)
    assert pool.take_events() == [BlockRemoved((_hash(5), _hash(4), _hash(3), _hash(2)))]
    assert pool.get_cached_block(_hash(5), [5]) is None
    assert pool.get_cached_block(_hash(1), [1]) is req_a[1]
    assert pool.free_block_ids() == [1, 0]


def test_touch_removes_cached_free_block_from_queue() -> None:
    pool = BlockPool(num_blocks=4, enable_caching=True)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_block(blocks[0], _hash(0), [7, 8])
    pool.free_blocks(reversed(blocks))
    assert pool.free_block_ids() == [2, 3, 1, 0]

    hit = pool.get_cached_block(_hash(0), [7, 8])
    assert hit is blocks[0]
    pool.touch([hit])

    assert hit.ref_cnt == 1
    assert pool.free_block_ids() == [2, 3, 1]
    assert [b.block_id for b in pool.get_new_blocks(3)] == [2, 3, 1]
    assert pool.get_cached_block(_hash(0), [7, 8]) is hit


def test_cached_block_verified_against_tokens() -> None:
    pool = BlockPool(num_blocks=2, enable_caching=True)
    block = pool.get_new_blocks(1)[0]
    pool.cache_full_block(block, _hash(1), [1, 2, 3])
    assert pool.get_cached_block(_hash(1), [1, 2, 3]) is block
    assert pool.get_cached_block(_hash(1), [1, 2, 4]) is None
    assert pool.get_cached_block(_hash(2), [1, 2, 3]) is None


def test_duplicate_hash_not_double_cached() -> None:
    pool = BlockPool(num_blocks=3, enable_caching=True)
    first, second = pool.get_new_blocks(2)
    pool.cache_full_block(first, _hash(1), [1])
    pool.cache_full_block(second, _hash(1), [1])
    assert first.block_hash == _hash(1)
    assert second.block_hash is None
    assert pool.take_events() == [BlockStored((_hash(1),), None)]
    pool.free_blocks([second, first])
    assert [b.block_id for b in pool.get_new_blocks(3)] == [2, 1, 0]
    assert pool.take_events() == [BlockRemoved((_hash(1),))]


def test_consecutive_stores_of_one_chain_share_an_event() -> None:
    pool = BlockPool(num_blocks=4, enable_caching=True)
    blocks = pool.get_new_blocks(4)
    pool.cache_full_block(blocks[0], _hash(0), [0])
    pool.cache_full_block(blocks[1], _hash(1), [1], parent_block_hash=_hash(0))
    pool.cache_full_block(blocks[2], _hash(2), [2], parent_block_hash=_hash(9))
    pool.cache_full_block(blocks[3], _hash(3), [3], parent_block_hash=_hash(2))
    assert pool.take_events() == [
        BlockStored((_hash(0), _hash(1)), None),
        BlockStored((_hash(2), _hash(3)), _hash(9)),
    ]
    assert pool.take_events() == []


def test_reset_prefix_cache() -> None:
    pool = BlockPool(num_blocks=3, enable_caching=True)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_block(blocks[0], _hash(0), [0])
    pool.take_events()
    assert pool.reset_prefix_cache() is False
    assert pool.get_cached_block(_hash(0), [0]) is blocks[0]

    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache() is True
    assert pool.get_cached_block(_hash(0), [0]) is None
    assert blocks[0].block_hash is None
    assert pool.take_events() == [AllBlocksCleared()]
    assert pool.free_block_ids() == [2, 0, 1]


def test_caching_disabled_never_caches() -> None:
    pool = BlockPool(num_blocks=2, enable_caching=False)
    block = pool.get_new_blocks(1)[0]
    pool.cache_full_block(block, _hash(0), [0])
    assert block.block_hash is None
    assert pool.get_cached_block(_hash(0), [0]) is None
    pool.free_blocks([block])
    assert pool.reset_prefix_cache() is True
    assert pool.take_events() == []
