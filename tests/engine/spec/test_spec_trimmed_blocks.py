"""A block table that loses blocks to rejected proposals and grows back to the same length with other blocks: the
runner must use the new blocks. With a pool tight enough that freed blocks go to other requests at once (2-token
blocks, proposals of 4 that are always rejected), a runner that kept its copy of the old table gives wrong tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from tests.engine.model_factory import step_to_end

TinyModel = tuple[Path, list[list[int]], list[list[int]]]


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # NOTE: on the shared 2-core test machine torch's spinning thread pool runs many times slower.
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(num_threads)


@pytest.mark.parametrize("tiny_model", ["qwen3"], indirect=True)
def test_tokens_equal_transformers_when_trimmed_blocks_are_reused(tiny_model: TinyModel) -> None:
    path, prompts, expected = tiny_model
    prompts, expected = prompts[:8], [e[:24] for e in expected[:8]]
    spec = {"method": "replay", "replay_corruption": 1.0, "num_speculative_tokens": 4, "min_acceptance": 0.0}
    engine = LLMEngine(engine_config(str(path), num_blocks=200, block_size=2, speculative_config=spec))
    engine.set_replay_recordings({tuple(p): e for p, e in zip(prompts, expected, strict=True)})
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    assert step_to_end(engine, prompts, params) == expected
    assert engine.spec_stats.draft_tokens > 100
    assert engine.scheduler.num_preemptions == 0
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.num_blocks
