"""Swap on preemption: a preempted request's KV goes to host memory and comes back, instead of being recomputed.

The lifecycle, as the scheduler drives it:
1. `swap_out(request)` when the request is preempted, before its blocks are freed: if the request has at least
   `swap_min_tokens` computed tokens and the host tier has room, its blocks covering them are copied to host slots
   it owns (`preemption_mode` tells which mode a request gets). Otherwise it is recomputed, as without a host tier.
   A request that cannot be recomputed (a decode pod's image prompt) is swapped whatever its length, if there is room;
   the scheduler never preempts it otherwise.
2. `computed_blocks(request)` when the scheduler tries to admit it again: the leading blocks still cached on the
   device (they need no copy) and the number of tokens whose KV it will have, the swapped ones included.
3. `swap_in(req_id)` once its blocks are allocated: the swapped blocks past the device hits are copied back into
   its new blocks and its host slots are freed.
4. `discard(req_id)` when it finishes or is aborted while swapped out: the slots are freed.

NOTE: recompute is cheaper for short contexts: a prefill of a few hundred tokens costs about one step, often
revives the request's own blocks from the device prefix cache for free, and needs no host memory. Swap pays off
once the prefill it saves costs more than the two copies over the host link.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.block_pool import KVBlock
from engine.kv_cache_manager import KVCacheManager
from engine.kv_tier.block_copier import BlockCopier
from engine.kv_tier.host_block_pool import HostBlockPool
from engine.request import Request

SWAP = "swap"
RECOMPUTE = "recompute"


@dataclass(slots=True)
class SwappedKV:
    """A swapped-out request's host slots, in block order, the tokens whose KV they hold, and how many leading
    blocks its readmission finds in the prefix cache instead."""

    slots: list[int]
    num_tokens: int
    num_hit_blocks: int = 0


class KVSwapper:
    """Swaps preempted requests' blocks between the device pool (through `kv`) and the host tier."""

    def __init__(self, kv: KVCacheManager, host: HostBlockPool, copier: BlockCopier, swap_min_tokens: int) -> None:
        self.kv = kv
        self.host = host
        self.copier = copier
        self.swap_min_tokens = swap_min_tokens
        self.swapped: dict[str, SwappedKV] = {}
        self.num_swapped_out = 0
        """Requests swapped out (preemptions in swap mode)."""
        self.num_swapped_in = 0
        self.num_blocks_swapped_out = 0
        self.num_blocks_swapped_in = 0
        """Blocks copied back to the device (a swapped block found in the prefix cache instead needs no copy)."""

    def preemption_mode(self, num_computed_tokens: int, recomputable: bool = True) -> str:
        """SWAP for a request with this many computed tokens if it is long enough (or cannot be recomputed at all:
        `Request.recomputable`) and the host tier has room, else RECOMPUTE."""
        if recomputable and num_computed_tokens < self.swap_min_tokens:
            return RECOMPUTE
        return SWAP if self.host.can_allocate(self._num_blocks(num_computed_tokens)) else RECOMPUTE

    def swap_out(self, request: Request) -> str:
        """Copy the preempted request's computed blocks to the host if swapping is its mode; the mode it got."""
        num_tokens = request.num_computed_tokens
        if self.preemption_mode(num_tokens, request.recomputable) == RECOMPUTE:
            return RECOMPUTE
        slots = self.host.allocate(self._num_blocks(num_tokens))
        assert slots is not None, "preemption_mode checked the room"
        self.copier.to_host(self.kv.get_block_ids(request.req_id)[: len(slots)], slots)
        self.swapped[request.req_id] = SwappedKV(slots, num_tokens)
        self.num_swapped_out += 1
        self.num_blocks_swapped_out += len(slots)
        return SWAP

    def computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """The request's device prefix hits and its tokens with KV once admitted (swapped ones included); for a
        request not swapped out, the prefix cache's answer."""
        hits, num_hit_tokens = self.kv.get_computed_blocks(
            request.req_id, request.block_token_ids, request.block_extra_keys
        )
        swapped = self.swapped.get(request.req_id)
        if swapped is None:
            return hits, num_hit_tokens
        # NOTE: preempted while its last token was in flight, it may have KV for every token it now has: the last
        # is computed again, since the step must produce logits.
        num_tokens = min(swapped.num_tokens, request.num_tokens - 1)
        if num_hit_tokens >= num_tokens:
            self.discard(request.req_id)
            return hits, num_hit_tokens
        # NOTE: prefix hits (a host-tier hit is copied back by the cache manager) need no copy from the swap.
        swapped.num_hit_blocks = num_hit_tokens // self.kv.block_size
        return hits, num_tokens

    def swap_in(self, request: Request) -> None:
        """After the admitted request's blocks are allocated: copy its swapped blocks past the prefix hits back."""
        swapped = self.swapped.pop(request.req_id, None)
        if swapped is None:
            return
        first, end = swapped.num_hit_blocks, self._num_blocks(request.num_computed_tokens)
        slots = swapped.slots[first:end]
        self.copier.to_device(slots, self.kv.get_block_ids(request.req_id)[first:end])
        self.host.free(swapped.slots)
        self.num_swapped_in += 1
        self.num_blocks_swapped_in += len(slots)

    def discard(self, req_id: str) -> None:
        """Free a swapped-out request's host slots (it finished or was aborted; unknown ids are ignored)."""
        swapped = self.swapped.pop(req_id, None)
        if swapped is not None:
            self.host.free(swapped.slots)

    def _num_blocks(self, num_tokens: int) -> int:
        return -(-num_tokens // self.kv.block_size)
