"""A preempted request's greedy output is the same whether it is swapped out and back in or recomputed."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from engine.core.engine_core import EngineCore
from engine.core.outputs import HostTierLoad
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from tests.engine.quant_support import greedy

NEW_TOKENS = 12
# 16 blocks of 16 tokens hold 256 tokens: 4 prompts of 60..97 tokens and their outputs preempt each other.
SMALL_POOL = {"num_blocks": 16, "max_model_len": 256, "long_prefill_token_threshold": 32}
# 2 MiB: 128 slots of the tiny model's 16 KiB blocks.
SWAP = {"swap_space": 2 / 1024, "swap_min_tokens": 80}


@pytest.fixture(scope="module")
def tiny_qwen3(tiny_qwen3_path: Path) -> tuple[Path, list[list[int]], list[list[int]]]:
    """(folder, prompts, their greedy outputs with a pool large enough for no preemption)."""
    path = tiny_qwen3_path
    rng = random.Random(3)
    prompts = [[rng.randrange(512) for _ in range(n)] for n in (97, 60, 90, 75)]
    reference = greedy(LLMEngine(engine_config(str(path), num_blocks=64)), prompts, NEW_TOKENS)
    return path, prompts, reference


@pytest.mark.parametrize(
    "kwargs",
    [
        {"enable_prefix_caching": False},
        {"enable_prefix_caching": False, "async_scheduling": True},
        {},
    ],
    # NOTE: swap-in after device prefix hits is exact in tests/engine/kv_tier/test_swap_scheduling.py.
    ids=["no-prefix-cache", "async", "host-prefix-cache"],
)
def test_swapped_requests_match_unpreempted_output(
    tiny_qwen3: tuple[Path, list[list[int]], list[list[int]]], kwargs: dict[str, Any]
) -> None:
    path, prompts, reference = tiny_qwen3
    engine = LLMEngine(engine_config(str(path), **SMALL_POOL, **SWAP, **kwargs))
    assert greedy(engine, prompts, NEW_TOKENS) == reference
    swapper = engine.scheduler.swapper
    assert swapper is not None
    assert engine.scheduler.num_preemptions > swapper.num_swapped_out > 0, "both modes must have been chosen"
    if not engine.config.cache.enable_prefix_caching:
        assert swapper.num_swapped_in == swapper.num_swapped_out
    if kwargs == {"enable_prefix_caching": False}:
        # NOTE: only with a token in flight at preemption (async) may the last swapped block be computed again.
        assert swapper.num_blocks_swapped_in == swapper.num_blocks_swapped_out
    # At least 80 tokens (5 blocks) a swap; the engine core's load snapshot carries the tier as it is.
    assert swapper.num_blocks_swapped_out >= 5 * swapper.num_swapped_out
    load = EngineCore(engine).load()
    assert load.host_tier == HostTierLoad(
        num_swap_preemptions=swapper.num_swapped_out,
        num_blocks_swapped_out=swapper.num_blocks_swapped_out,
        num_blocks_swapped_in=swapper.num_blocks_swapped_in,
        num_slots=128,
        num_swapped_slots=0,
        num_cached_slots=swapper.host.num_cached,
    )
    assert load.prefix_cache_host_hits == engine.kv_cache_manager.stats.host_hits
    # Every host slot and device block is back: the slots still cached are evictable.
    assert (swapper.swapped, swapper.host.num_free_slots) == ({}, swapper.host.num_slots)
    assert engine.kv_cache_manager.num_free_blocks == 16
