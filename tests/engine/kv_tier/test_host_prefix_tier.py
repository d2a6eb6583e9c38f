"""A prompt whose prefix was evicted from the device pool is served from the host tier: fewer tokens computed, the
same greedy output."""

from __future__ import annotations

import random
from pathlib import Path

from common.kv_cache_events import BlockRemoved, BlockStored
from common.sampling_params import SamplingParams
from engine.kv_tier.tiered_kv_cache_manager import TieredKVCacheManager
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.scheduler_output import SchedulerOutput

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


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


def test_evicted_prefix_is_copied_back_from_the_host_tier(tiny_qwen3_path: Path) -> None:
    a, b, c = prompts()
    path = str(tiny_qwen3_path)
    expected, _ = run(LLMEngine(engine_config(path, num_blocks=64)), "b", b)
    # 12 blocks: c (174 tokens, 11 blocks) evicts a's cached blocks 3, 2 and 1 (a request's blocks are freed tail
    # first); a's first block stays on the device.
    without = LLMEngine(engine_config(path, num_blocks=12))
    run(without, "a", a)
    run(without, "c", c)
    assert run(without, "b", b) == (expected, 76 - 16 + 3)  # all but a's first block recomputed, then 3 decodes
    engine = LLMEngine(engine_config(path, num_blocks=12, swap_space=2 / 1024))
    kv = engine.kv_cache_manager
    assert isinstance(kv, TieredKVCacheManager)
    run(engine, "a", a)
    run(engine, "c", c)
    events = kv.take_events()
    moved = [e.block_hashes for e in events if isinstance(e, BlockStored) and e.tier == "host"]
    assert [len(hashes) for hashes in moved] == [1, 1, 1]
    removed = [e.block_hashes for e in events if isinstance(e, BlockRemoved) and e.tier == "device"]
    assert removed == [tuple(h for (h,) in moved)]
    # The 3 evicted blocks of the prefix come back from the host: b computes its 12-token suffix and 3 decodes.
    assert run(engine, "b", b) == (expected, 76 - 64 + 3)
    assert (kv.stats.host_hits, kv.stats.hits) == (48, 64)
    # b's copied-back blocks are device-cached again, one chain; b's allocation moved 3 of c's blocks to the host.
    restored = [e for e in kv.take_events() if isinstance(e, BlockStored) and e.tier == "device"]
    assert [e.block_hashes for e in restored] == [tuple(h for (h,) in reversed(moved))]
    assert kv.host.num_cached == 6
    assert kv.num_free_blocks == 12
