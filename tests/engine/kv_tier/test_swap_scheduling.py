"""Swap on preemption in the scheduler: which requests are swapped, which blocks move, and what resumes."""

from __future__ import annotations

import pytest

from engine.config import SchedulerConfig
from engine.kv_cache_manager import KVCacheManager
from engine.kv_tier.host_block_pool import HostBlockPool
from engine.kv_tier.swapper import RECOMPUTE, SWAP, KVSwapper
from engine.request import RequestStatus
from engine.scheduler import Scheduler
from tests.engine.kv_tier.fake_copier import FakeCopier
from tests.engine.test_scheduler import BLOCK, request, shape, step


def make_scheduler(num_blocks: int, num_slots: int, swap_min_tokens: int) -> tuple[Scheduler, KVSwapper, FakeCopier]:
    kv = KVCacheManager(num_blocks, BLOCK)
    copier = FakeCopier()
    swapper = KVSwapper(kv, HostBlockPool(num_slots), copier, swap_min_tokens)
    return Scheduler(SchedulerConfig(), kv, max_model_len=1024, swapper=swapper), swapper, copier


def preempt_b(s: Scheduler) -> None:
    """a and b (7-token prompts) fill the 4 blocks; a's third block preempts b after 2 outputs (8 computed)."""
    s.add_request(request("a", 7, max_tokens=6))
    s.add_request(request("b", 7, max_tokens=6, first=200))
    step(s)
    step(s)
    out, _ = step(s)
    assert shape(out) == [("a", 8, 1, True)]
    assert s.num_preemptions == 1


def test_preemption_mode_by_computed_tokens_and_host_room() -> None:
    _, swapper, _ = make_scheduler(num_blocks=4, num_slots=3, swap_min_tokens=8)
    decisions = {n: swapper.preemption_mode(n) for n in (0, 7, 8, 12, 13)}
    # 13 tokens need 4 blocks of 4: more than the 3 host slots.
    assert decisions == {0: RECOMPUTE, 7: RECOMPUTE, 8: SWAP, 12: SWAP, 13: RECOMPUTE}


def test_short_request_is_recomputed() -> None:
    s, swapper, copier = make_scheduler(num_blocks=4, num_slots=8, swap_min_tokens=9)
    preempt_b(s)
    assert (swapper.num_swapped_out, copier.copies, swapper.host.num_free_slots) == (0, [], 8)
    assert swapper.num_blocks_swapped_out == 0


@pytest.mark.parametrize("prefix_cached", [True, False])
def test_long_request_is_swapped_out_and_back_in(prefix_cached: bool) -> None:
    s, swapper, copier = make_scheduler(num_blocks=4, num_slots=8, swap_min_tokens=8)
    if not prefix_cached:
        s.kv.enable_prefix_caching = False
    preempt_b(s)
    b = s.requests["b"]
    assert (b.status, b.num_computed_tokens, b.output_token_ids) == (RequestStatus.PREEMPTED, 0, [7, 7])
    # b held blocks 2 and 3 (8 tokens): both go to host slots 0 and 1.
    assert copier.copies == [("to_host", [2, 3], [0, 1])]
    assert swapper.host.num_free_slots == 6
    assert (swapper.num_blocks_swapped_out, swapper.host.num_owned_slots) == (2, 2)
    for _ in range(3):
        step(s)
    assert "a" not in s.requests
    out, _ = step(s)
    # b resumes with its 8 tokens' KV and computes its newest token only. With prefix caching its first block
    # (cached, then freed) is still on the device: only its second comes back from the host.
    assert shape(out) == [("b", 8, 1, True)]
    table = out.scheduled[0].block_ids
    if prefix_cached:
        assert table[0] == 2
        assert copier.copies[1:] == [("to_device", [1], [table[1]])]
    else:
        assert copier.copies[1:] == [("to_device", [0, 1], table[:2])]
    assert (swapper.num_swapped_in, swapper.host.num_free_slots) == (1, 8)
    assert (swapper.num_blocks_swapped_in, swapper.host.num_owned_slots) == (1 if prefix_cached else 2, 0)


def test_abort_while_swapped_out_frees_the_host_slots() -> None:
    s, swapper, _ = make_scheduler(num_blocks=4, num_slots=8, swap_min_tokens=8)
    preempt_b(s)
    assert swapper.host.num_free_slots == 6
    s.abort_requests(["b"])
    assert (swapper.swapped, swapper.host.num_free_slots) == ({}, 8)
