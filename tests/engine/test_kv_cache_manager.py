from __future__ import annotations

from collections.abc import Sequence

import pytest

from common.block_hash import BlockHash, hash_block_tokens, hash_prompt_blocks
from common.kv_cache_events import BlockRemoved, BlockStored
from engine.kv_cache_manager import KVCacheManager

BLOCK_SIZE = 4
PROMPT = list(range(100, 114))  # 3 full blocks + 2 tokens


def _prefill(manager: KVCacheManager, req_id: str, token_ids: Sequence[int]) -> list[int]:
    """Admit a request as the scheduler does and compute its whole prompt in one step."""
    computed, _ = manager.get_computed_blocks(req_id, token_ids)
    new_ids = manager.allocate_slots(req_id, len(token_ids), computed)
    assert new_ids is not None
    manager.cache_blocks(req_id, token_ids, len(token_ids))
    return new_ids


def test_second_request_shares_three_block_prefix() -> None:
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    assert _prefill(manager, "a", PROMPT) == [0, 1, 2, 3]
    prompt_b = [*PROMPT[:12], 900, 901, 902, 903, 904]

    computed, num_computed = manager.get_computed_blocks("b", prompt_b)
    assert [b.block_id for b in computed] == [0, 1, 2]
    assert num_computed == 12
    assert manager.allocate_slots("b", len(prompt_b), computed) == [4, 5]

    assert manager.get_block_ids("a") == [0, 1, 2, 3]
    assert manager.get_block_ids("b") == [0, 1, 2, 4, 5]
    assert [manager.block_pool.blocks[i].ref_cnt for i in range(6)] == [2, 2, 2, 1, 1, 1]
    assert manager.num_free_blocks == 4
    assert manager.usage() == pytest.approx(0.6)
    assert manager.take_events() == [BlockStored(tuple(hash_prompt_blocks(PROMPT, BLOCK_SIZE)), None)]


def test_cap_leaves_one_token_to_compute() -> None:
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    prompt = PROMPT[:8]
    _prefill(manager, "a", prompt)
    computed, num_computed = manager.get_computed_blocks("b", prompt)
    assert [b.block_id for b in computed] == [0]
    assert num_computed == 4
    computed, num_computed = manager.get_computed_blocks("c", [*prompt, 1])
    assert [b.block_id for b in computed] == [0, 1]
    assert num_computed == 8


def test_allocate_returns_none_and_changes_nothing_when_short() -> None:
    manager = KVCacheManager(num_blocks=4, block_size=BLOCK_SIZE)
    prompt = PROMPT[:9]
    assert _prefill(manager, "a", prompt) == [0, 1, 2]
    manager.free("a")
    assert manager.block_pool.free_block_ids() == [3, 2, 1, 0]
    assert manager.allocate_slots("x", 8) == [3, 2]

    computed, _ = manager.get_computed_blocks("b", prompt)
    assert [b.block_id for b in computed] == [0, 1]
    # Two cached free blocks to revive plus one new block, with only those two blocks free.
    assert manager.allocate_slots("b", 9, computed) is None
    assert manager.get_block_ids("b") == []
    assert [b.ref_cnt for b in computed] == [0, 0]
    assert manager.block_pool.free_block_ids() == [1, 0]
    assert manager.take_events() == [BlockStored(tuple(hash_prompt_blocks(prompt, BLOCK_SIZE)), None)]

    assert manager.allocate_slots("b", 8, computed) == []
    assert manager.get_block_ids("b") == [0, 1]
    assert manager.num_free_blocks == 0
    assert manager.allocate_slots("x", 9) is None
    assert manager.get_block_ids("x") == [3, 2]


def test_decode_growth_allocates_at_block_boundary() -> None:
    manager = KVCacheManager(num_blocks=8, block_size=BLOCK_SIZE)
    assert manager.allocate_slots("a", 5) == [0, 1]
    assert [manager.allocate_slots("a", n) for n in (6, 7, 8, 9, 10, 12, 13)] == [[], [], [], [2], [], [], [3]]
    assert manager.get_block_ids("a") == [0, 1, 2, 3]


def test_chunked_prefill_caches_each_computed_block_once() -> None:
    manager = KVCacheManager(num_blocks=8, block_size=BLOCK_SIZE)
    hashes = hash_prompt_blocks(PROMPT, BLOCK_SIZE)
    manager.get_computed_blocks("a", PROMPT)
    assert manager.allocate_slots("a", 6) == [0, 1]
    manager.cache_blocks("a", PROMPT, 6)
    assert manager.take_events() == [BlockStored((hashes[0],), None)]
    assert manager.allocate_slots("a", 14) == [2, 3]
    manager.cache_blocks("a", PROMPT, 14)
    manager.cache_blocks("a", PROMPT, 14)
    assert manager.take_events() == [BlockStored((hashes[1], hashes[2]), hashes[0])]
    assert [manager.block_pool.blocks[i].block_hash for i in range(4)] == [*hashes, None]


def test_hashes_are_extended_incrementally(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def counting_hash(parent: BlockHash | None, token_ids: Sequence[int], extra_keys: Sequence[str] = ()) -> bytes:
        calls.append(token_ids[0])
        return hash_block_tokens(parent, token_ids, extra_keys)

    monkeypatch.setattr("engine.kv_cache_manager.hash_block_tokens", counting_hash)
    manager = KVCacheManager(num_blocks=8, block_size=BLOCK_SIZE)
    token_ids = list(PROMPT)
    _prefill(manager, "a", token_ids)
    for token in range(7):
        token_ids.append(token)
        manager.allocate_slots("a", len(token_ids))
        manager.cache_blocks("a", token_ids, len(token_ids))
    assert len(token_ids) == 21
    assert calls == [100, 104, 108, 112, 2]


def test_free_everything_and_preempted_request_hits_its_own_blocks() -> None:
    manager = KVCacheManager(num_blocks=6, block_size=BLOCK_SIZE)
    _prefill(manager, "a", PROMPT)
    _prefill(manager, "b", [*PROMPT[:12], 7, 7, 7, 7, 7])
    assert manager.num_free_blocks == 0
    manager.free("b")
    manager.free("a")
    manager.free("unknown")
    assert manager.num_free_blocks == 6
    assert manager.usage() == 0.0
    # b frees its tail first (5, 4; its shared blocks stay held by a), then a: 3, 2, 1, 0.
    assert manager.block_pool.free_block_ids() == [5, 4, 3, 2, 1, 0]

    computed, num_computed = manager.get_computed_blocks("a", PROMPT)
    assert [b.block_id for b in computed] == [0, 1, 2]
    assert num_computed == 12
    assert manager.allocate_slots("a", len(PROMPT), computed) == [5]
    assert manager.get_block_ids("a") == [0, 1, 2, 5]


def test_eviction_takes_a_cached_prefix_from_its_tail() -> None:
    manager = KVCacheManager(num_blocks=5, block_size=BLOCK_SIZE)
    hashes = hash_prompt_blocks(PROMPT, BLOCK_SIZE)
    _prefill(manager, "a", PROMPT)
    manager.free("a")
    manager.take_events()
    assert manager.allocate_slots("x", 12) == [4, 3, 2]
    assert manager.take_events() == [BlockRemoved((hashes[2],))]
    computed, num_computed = manager.get_computed_blocks("a", PROMPT)
    assert [b.block_id for b in computed] == [0, 1]
    assert num_computed == 8


def test_stats_count_tokens() -> None:
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    _prefill(manager, "a", PROMPT)
    _prefill(manager, "b", [*PROMPT[:12], 1, 2, 3, 4, 5, 6])
    assert (manager.stats.queries, manager.stats.hits) == (32, 12)
    assert manager.stats.hit_rate == pytest.approx(12 / 32)


def test_prefix_caching_off_never_hits() -> None:
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE, enable_prefix_caching=False)
    assert _prefill(manager, "a", PROMPT) == [0, 1, 2, 3]
    assert manager.get_computed_blocks("b", PROMPT) == ([], 0)
    assert _prefill(manager, "b", PROMPT) == [4, 5, 6, 7]
    assert manager.take_events() == []
    assert (manager.stats.queries, manager.stats.hits) == (0, 0)
    assert manager.stats.hit_rate == 0.0


def test_extra_keys_prevent_sharing() -> None:
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE, extra_keys=("model-a",))
    _prefill(manager, "a", PROMPT)
    own = hash_prompt_blocks(PROMPT, BLOCK_SIZE, ("model-a",))
    assert manager.take_events() == [BlockStored(tuple(own), None)]
    assert [manager.block_pool.blocks[i].block_hash for i in range(3)] == own

    for extra_keys in [("model-b",), ("model-a", "tenant-salt"), ()]:
        other = hash_prompt_blocks(PROMPT, BLOCK_SIZE, extra_keys)
        for i, block_hash in enumerate(other):
            assert manager.block_pool.get_cached_block(block_hash, PROMPT[4 * i : 4 * i + 4]) is None
        assert not set(other) & set(own)

    plain = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    _prefill(plain, "a", PROMPT)
    assert plain.take_events() == [BlockStored(tuple(hash_prompt_blocks(PROMPT, BLOCK_SIZE)), None)]


def test_a_requests_own_extra_keys_share_blocks_only_with_the_same_keys() -> None:
    manager = KVCacheManager(num_blocks=20, block_size=BLOCK_SIZE, extra_keys=("model-a",))
    salted = ("model-a", "tenant-1")
    computed, _ = manager.get_computed_blocks("a", PROMPT, salted)
    assert manager.allocate_slots("a", len(PROMPT), computed) == [0, 1, 2, 3]
    manager.cache_blocks("a", PROMPT, len(PROMPT), salted)
    assert manager.take_events() == [BlockStored(tuple(hash_prompt_blocks(PROMPT, BLOCK_SIZE, salted)), None)]
    assert manager.get_computed_blocks("same-salt", PROMPT, salted)[1] == 12
    assert manager.get_computed_blocks("other-salt", PROMPT, ("model-a", "tenant-2"))[1] == 0
    assert manager.get_computed_blocks("unsalted", PROMPT)[1] == 0


def test_reset_prefix_cache_only_when_idle() -> None:
    manager = KVCacheManager(num_blocks=6, block_size=BLOCK_SIZE)
    _prefill(manager, "a", PROMPT)
    assert manager.reset_prefix_cache() is False
    manager.free("a")
    assert manager.reset_prefix_cache() is True
    assert manager.get_computed_blocks("a", PROMPT) == ([], 0)


def test_computed_blocks_rejected_after_first_allocation() -> None:
    manager = KVCacheManager(num_blocks=6, block_size=BLOCK_SIZE)
    _prefill(manager, "a", PROMPT)
    computed, _ = manager.get_computed_blocks("b", PROMPT)
    assert manager.allocate_slots("b", 14, computed) == [4]
    with pytest.raises(ValueError):
        manager.allocate_slots("b", 15, computed)


def test_trim_gives_back_the_blocks_of_rejected_speculative_tokens() -> None:
    manager = KVCacheManager(num_blocks=6, block_size=BLOCK_SIZE)
    tokens = list(range(100, 112))
    assert manager.allocate_slots("a", 5) == [0, 1]
    manager.cache_blocks("a", tokens, 5)
    assert manager.allocate_slots("a", 12) == [2]  # 5 computed + 7 proposed
    manager.trim("a", 7)  # 2 of them accepted
    assert manager.get_block_ids("a") == [0, 1]
    assert manager.num_free_blocks == 4
    manager.trim("a", 8)  # nothing past the table: unchanged
    assert manager.get_block_ids("a") == [0, 1]
    assert manager.allocate_slots("a", 9) == [3]  # block 2 went to the free queue tail
    manager.free("a")
    assert manager.num_free_blocks == 6
