"""Speculative decoding on the GPU: with CUDA graphs (and async scheduling) or eagerly, the verified greedy tokens
are transformers' own, and the pool drains. Steps that verify proposals run eagerly; the others replay graphs."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from tests.engine.model_factory import NEW_TOKENS, hf_greedy, make_prompts, save_tiny_model, step_to_end

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def qwen3_case(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[int]], list[list[int]]]:
    path = save_tiny_model("qwen3", tmp_path_factory.mktemp("gpu-spec-qwen3"))
    prompts = make_prompts(vocab_size=512)
    return path, prompts, hf_greedy(path, prompts, NEW_TOKENS, device="cuda")


@pytest.mark.parametrize("enforce_eager", [False, True])
def test_verified_tokens_equal_with_and_without_cuda_graphs(
    qwen3_case: tuple[Path, list[list[int]], list[list[int]]], enforce_eager: bool
) -> None:
    path, prompts, expected = qwen3_case
    spec = {"method": "replay", "replay_corruption": 0.3, "num_speculative_tokens": 4}
    config = engine_config(
        str(path), dtype="float32", num_blocks=512, enforce_eager=enforce_eager, speculative_config=spec
    )
    engine = LLMEngine(config)
    engine.set_replay_recordings({tuple(p): e for p, e in zip(prompts, expected, strict=True)})
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    assert step_to_end(engine, prompts, params) == expected
    assert engine.spec_stats.accepted_tokens > 0
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.num_blocks
