"""A prompt whose prefix was evicted from the device pool is served from the host tier: fewer tokens computed, the
same greedy output."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from common.kv_cache_events import BlockRemoved, BlockStored
from common.sampling_params import SamplingParams
from engine.kv_tier.tiered_kv_cache_manager import TieredKVCacheManager
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.scheduler_output import SchedulerOutput
from tests.engine.model_factory import save_tiny_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def prompts() -> tuple[list[int], list[int], list[int]]:
    """a and b share a 64-token prefix (4 blocks); c, unrelated, is long enough to evict a's blocks."""
    rng = random.Random(5)
    prefix = [rng.randrange(512) for _ in range(64)]
    a = prefix + [rng.randrange(512) for _ in range(10)]
    b = prefix + [rng.randrange(512) for _ in range(12)]
    c = [rng.randrange(512) for _ in range(170)]
    return a, b, c


def run(engine: LLMEngine, req_id: str, prompt: list[int]) -> tuple[list[int], int]:
    """The request's greedy output and the tokens the engine computed for it."""
    steps: list[SchedulerOutput] = []
    schedule = engine.scheduler.schedule

    def recording_schedule() -> SchedulerOutput:
        steps.append(schedule())
        return steps[-1]

    engine.scheduler.schedule = recording_schedule  # type: ignore[method-assign]
    engine.add_request(req_id, prompt, GREEDY)
    output: list[int] = []
    while engine.has_unfinished_requests():
        output += [t for out in engine.step() for t in out.new_token_ids]
    del engine.scheduler.schedule
    return output, sum(len(r.token_ids) for out in steps for r in out.scheduled)


def test_evicted_prefix_is_copied_back_from_the_host_tier(tiny_llama: Path) -> None:
    a, b, c = prompts()
    expected, _ = run(LLMEngine(engine_config(str(tiny_llama), num_blocks=64)), "b", b)
    results = {}
    for swap_space in (0.0, 2 / 1024):
        # 12 blocks: c (174 tokens, 11 blocks) evicts a's cached blocks 4..1 (the pool frees a request's tail first).
        engine = LLMEngine(engine_config(str(tiny_llama), num_blocks=12, swap_space=swap_space))
        run(engine, "a", a)
        run(engine, "c", c)
        output, computed = run(engine, "b", b)
        assert output == expected
        results[swap_space] = computed
        assert engine.kv_cache_manager.num_free_blocks == 12
    # Without the host tier b recomputes all but a's first block (16 tokens); with it, the 3 evicted blocks of the
    # prefix come back from the host: b computes its 12-token suffix and 3 decode steps only.
    assert results == {0.0: 76 - 16 + 3, 2 / 1024: 76 - 64 + 3}


def test_host_tier_events_and_hit_count(tiny_llama: Path) -> None:
    a, b, c = prompts()
    engine = LLMEngine(engine_config(str(tiny_llama), num_blocks=12, swap_space=2 / 1024))
    kv = engine.kv_cache_manager
    assert isinstance(kv, TieredKVCacheManager)
    run(engine, "a", a)
    run(engine, "c", c)
    events = kv.take_events()
    moved = [e.block_hashes for e in events if isinstance(e, BlockStored) and e.tier == "host"]
    # a's cached blocks 3, 2 and 1 (a request's blocks are freed tail first), one event each.
    assert [len(hashes) for hashes in moved] == [1, 1, 1]
    removed = [e.block_hashes for e in events if isinstance(e, BlockRemoved) and e.tier == "device"]
    assert removed == [tuple(h for (h,) in moved)]
    run(engine, "b", b)
    assert kv.num_host_hit_tokens == 48
    # b's copied-back blocks are device-cached again, one chain; b's allocation moved 3 of c's blocks to the host.
    restored = [e for e in kv.take_events() if isinstance(e, BlockStored) and e.tier == "device"]
    assert [e.block_hashes for e in restored] == [tuple(h for (h,) in reversed(moved))]
    assert kv.host.num_cached == 6
