"""Per-request KV block tables over one `BlockPool`, with prefix caching: what the scheduler calls.

A request's life, as the scheduler drives it:
1. `get_computed_blocks(req_id, token_ids)`: the longest cached prefix of full blocks (no refs taken).
2. `allocate_slots(req_id, num_tokens, computed_blocks)`: the first call puts the hit blocks at the
   head of the block table and adds new blocks; later calls grow the table as tokens are computed.
3. `cache_blocks(req_id, token_ids, num_computed_tokens)` after each step: newly full, computed blocks
   become shareable (`trim` gives back blocks of rejected speculative tokens before that).
4. `free(req_id)` on finish, abort or preemption. A preempted request starts again at step 1 and
   usually hits its own blocks, still cached in the free queue.
Beam search (`engine.beam`) shares tables: `fork` gives requests the tables of others (a reference more on each
block), `copy_on_write` gives a request that is about to write into a block it shares a copy of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from common.block_hash import BlockHash, hash_block_tokens
from common.kv_cache_events import KVCacheEvent
from engine.block_pool import BlockPool, KVBlock


class NoFreeBlocksError(Exception):
    """The pool has no free block for a copy-on-write."""


@dataclass(slots=True)
class PrefixCacheStats:
    """Prefix cache lookups, in tokens: `queries` looked up, `hits` found cached, `host_hits` of those found in the
    host tier (copied back to the device; `TieredKVCacheManager`)."""

    queries: int = 0
    hits: int = 0
    host_hits: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class KVCacheManager:
    """Block tables of running requests and their prefix cache hits, over a pool of `num_blocks`."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        extra_keys: tuple[str, ...] = (),
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.extra_keys = extra_keys
        self.block_pool = BlockPool(num_blocks, enable_prefix_caching)
        self.stats = PrefixCacheStats()
        self._req_blocks: dict[str, list[KVBlock]] = {}
        # NOTE: the ids of _req_blocks kept alongside: the scheduler reads every running request's table each step.
        self._req_block_ids: dict[str, list[int]] = {}
        # NOTE: a request's block hashes only ever grow with its tokens; dropped on free.
        self._req_block_hashes: dict[str, list[BlockHash]] = {}
        self._num_cached_blocks: dict[str, int] = {}
        self._pending_lookups: dict[str, tuple[int, int]] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds (cached free blocks included)."""
        return self.block_pool.num_free_blocks

    def usage(self) -> float:
        """Fraction of the pool held by requests."""
        return self.block_pool.usage

    def get_block_ids(self, req_id: str) -> list[int]:
        """The request's block table (empty for an unknown request)."""
        return list(self._req_block_ids.get(req_id, ()))

    def get_computed_blocks(
        self, req_id: str, token_ids: Sequence[int], extra_keys: tuple[str, ...] | None = None
    ) -> tuple[list[KVBlock], int]:
        """Longest verified cached prefix of full blocks, and its length in tokens. `extra_keys`: the request's own
        block hash keys (e.g. with its cache salt); None: the manager's.

        At least one token is always left to compute (the step must produce logits), so at most
        `(len(token_ids) - 1) // block_size` blocks are returned. No ref counts change.
        """
        if not self.enable_prefix_caching:
            return [], 0
        block_hashes = self._block_hashes(req_id, token_ids, extra_keys)
        max_blocks = max(len(token_ids) - 1, 0) // self.block_size
        computed: list[KVBlock] = []
        for i, block_hash in enumerate(block_hashes[:max_blocks]):
            start = i * self.block_size
            block = self.block_pool.get_cached_block(block_hash, token_ids[start : start + self.block_size])
            if block is None:
                break
            computed.append(block)
        num_computed_tokens = len(computed) * self.block_size
        # NOTE: counted when the request is admitted (allocate_slots), not per lookup: a request waiting
        # for blocks is looked up every step.
        self._pending_lookups[req_id] = (len(token_ids), num_computed_tokens)
        return computed, num_computed_tokens

    def allocate_slots(self, req_id: str, num_tokens: int, computed_blocks: Sequence[KVBlock] = ()) -> list[int] | None:
        """Make the request hold `ceil(num_tokens / block_size)` blocks; return the new block ids.

        `computed_blocks` (from `get_computed_blocks`) are only accepted on the request's first
        allocation, where they become the head of its block table. Returns None, changing nothing,
        when the free queue cannot supply the blocks.
        """
        held = self._req_blocks.get(req_id)
        if held is not None and computed_blocks:
            raise ValueError(f"request {req_id!r} already holds blocks; computed_blocks must be empty")
        num_held = len(held) if held is not None else len(computed_blocks)
        num_new = max(-(-num_tokens // self.block_size) - num_held, 0)
        if num_new == 0 and held is not None:
            return []
        # NOTE: touching a cached free block takes it out of the free queue, so it costs budget too.
        num_revived = sum(1 for block in computed_blocks if block.ref_cnt == 0)
        if num_new + num_revived > self.block_pool.num_free_blocks:
            return None
        if held is None:
            queries, hits = self._pending_lookups.pop(req_id, (0, 0))
            self.stats.queries += queries
            self.stats.hits += hits
            self.block_pool.touch(computed_blocks)
            held = self._req_blocks[req_id] = list(computed_blocks)
            self._req_block_ids[req_id] = [block.block_id for block in computed_blocks]
            self._num_cached_blocks[req_id] = len(computed_blocks)
        new_blocks = self.block_pool.get_new_blocks(num_new)
        held.extend(new_blocks)
        new_ids = [block.block_id for block in new_blocks]
        self._req_block_ids[req_id].extend(new_ids)
        return new_ids

    def cache_blocks(
        self, req_id: str, token_ids: Sequence[int], num_computed_tokens: int, extra_keys: tuple[str, ...] | None = None
    ) -> None:
        """Cache the request's blocks that are full and fully computed, in order, each once (hashed with
        `extra_keys`, as in `get_computed_blocks`)."""
        if not self.enable_prefix_caching:
            return
        num_cached = self._num_cached_blocks[req_id]
        if num_computed_tokens // self.block_size <= num_cached:
            return  # the common case, checked first: called for every running request every step
        blocks = self._req_blocks[req_id]
        num_full = min(num_computed_tokens // self.block_size, len(token_ids) // self.block_size, len(blocks))
        if num_full <= num_cached:
            return
        block_hashes = self._block_hashes(req_id, token_ids, extra_keys)
        for i in range(num_cached, num_full):
            start = i * self.block_size
            self.block_pool.cache_full_block(
                blocks[i],
                block_hashes[i],
                token_ids[start : start + self.block_size],
                parent_block_hash=block_hashes[i - 1] if i > 0 else None,
            )
        self._num_cached_blocks[req_id] = num_full

    def trim(self, req_id: str, num_tokens: int) -> bool:
        """Shrink the request's table to `ceil(num_tokens / block_size)` blocks (speculative decoding takes back
        rejected proposals); the blocks past it were never cached and go back to the free queue, tail first. Whether
        any block went."""
        blocks = self._req_blocks[req_id]
        keep = -(-num_tokens // self.block_size)
        if keep >= len(blocks):
            return False
        assert keep >= self._num_cached_blocks[req_id], "trimming a cached block"
        dropped = blocks[keep:]
        del blocks[keep:], self._req_block_ids[req_id][keep:]
        self.block_pool.free_blocks(reversed(dropped))
        return True

    def fork(self, parents: Mapping[str, str]) -> None:
        """Each request `child` of `parents` now holds the blocks of request `parents[child]` (as they were before
        this call), sharing them: one reference more on each, none copied; the child's own blocks are freed."""
        tables = {child: list(self._req_blocks.get(parent, ())) for child, parent in parents.items()}
        hashes = {child: list(self._req_block_hashes.get(parent, ())) for child, parent in parents.items()}
        num_cached = {child: self._num_cached_blocks.get(parent, 0) for child, parent in parents.items()}
        for blocks in tables.values():
            self.block_pool.touch(blocks)
        for child in parents:
            self.free(child)
            self._req_blocks[child] = tables[child]
            self._req_block_ids[child] = [block.block_id for block in tables[child]]
            self._req_block_hashes[child] = hashes[child]
            self._num_cached_blocks[child] = num_cached[child]

    def copy_on_write(self, req_id: str, position: int) -> tuple[int, int] | None:
        """Before the request writes the KV of token `position`: if the block that holds it is shared, the request
        gets a new block in its place. Returns (source, destination) block ids for the device copy, or None when
        nothing is to copy. Raises NoFreeBlocksError when the pool has no block to copy into."""
        blocks = self._req_blocks[req_id]
        index = position // self.block_size
        if index >= len(blocks) or blocks[index].ref_cnt == 1:
            return None
        if self.block_pool.num_free_blocks == 0:
            raise NoFreeBlocksError(f"no free block to copy block {blocks[index].block_id} into")
        assert index >= self._num_cached_blocks[req_id], "writing into a cached block"
        (copy,) = self.block_pool.get_new_blocks(1)
        source = blocks[index]
        self.block_pool.free_blocks([source])
        blocks[index] = copy
        self._req_block_ids[req_id][index] = copy.block_id
        return source.block_id, copy.block_id

    def free(self, req_id: str) -> None:
        """Release the request's blocks, tail first, so a cached prefix is evicted from its tail first."""
        blocks = self._req_blocks.pop(req_id, None)
        self._req_block_ids.pop(req_id, None)
        self._req_block_hashes.pop(req_id, None)
        self._pending_lookups.pop(req_id, None)
        self._num_cached_blocks.pop(req_id, None)
        if blocks is not None:
            self.block_pool.free_blocks(reversed(blocks))

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash; False (nothing done) while any request holds blocks."""
        return self.block_pool.reset_prefix_cache()

    def take_events(self) -> list[KVCacheEvent]:
        """Cache events since the last call, for the directory publisher."""
        return self.block_pool.take_events()

    def _block_hashes(
        self, req_id: str, token_ids: Sequence[int], extra_keys: tuple[str, ...] | None
    ) -> list[BlockHash]:
        """The request's chained hashes of its full blocks, extended for tokens added since last time."""
        block_hashes = self._req_block_hashes.setdefault(req_id, [])
        keys = self.extra_keys if extra_keys is None else extra_keys
        for i in range(len(block_hashes), len(token_ids) // self.block_size):
            start = i * self.block_size
            parent = block_hashes[-1] if block_hashes else None
            block_hashes.append(hash_block_tokens(parent, token_ids[start : start + self.block_size], keys))
        return block_hashes
