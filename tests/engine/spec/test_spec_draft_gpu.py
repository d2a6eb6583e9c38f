"""Draft-model speculation on the GPU: with CUDA graphs (the draft's at query lengths 1 and 2, the target's verify
graphs, async scheduling) or eagerly, greedy tokens are transformers' own and seeded samples those without
speculation; the target as its own draft accepts every proposal."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.spec.draft_speculator import DraftSpeculator
from tests.engine.model_factory import NEW_TOKENS, hf_greedy, make_prompts, save_tiny_model, step_to_end

pytestmark = pytest.mark.gpu

Case = tuple[Path, Path, list[list[int]], list[list[int]]]


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> Case:
    target = save_tiny_model("qwen3", tmp_path_factory.mktemp("gpu-draft-target"))
    draft = save_tiny_model("llama", tmp_path_factory.mktemp("gpu-draft-random"), seed=1)
    prompts = make_prompts(vocab_size=512)
    return target, draft, prompts, hf_greedy(target, prompts, NEW_TOKENS, device="cuda")


def decode(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    tokens = step_to_end(engine, prompts, params)
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.num_blocks
    return tokens


def draft_engine(target: Path, draft: Path, enforce_eager: bool, **kwargs: Any) -> tuple[LLMEngine, Counter[int]]:
    """The engine, and a count of its draft's graph replays by query length."""
    spec = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 4}
    config = engine_config(
        str(target), dtype="float32", num_blocks=512, enforce_eager=enforce_eager, speculative_config=spec, **kwargs
    )
    engine = LLMEngine(config)
    speculator = engine.speculator
    assert isinstance(speculator, DraftSpeculator)
    replays: Counter[int] = Counter()
    graphs = speculator.draft.runner.cuda_graphs
    assert (graphs is None) == enforce_eager
    if graphs is not None:
        replay = graphs.replay

        def counted(bs: int, query_len: int = 1) -> torch.Tensor:
            replays[query_len] += 1
            return replay(bs, query_len)

        graphs.replay = counted  # type: ignore[method-assign]
    return engine, replays


@pytest.mark.parametrize("enforce_eager", [False, True])
def test_greedy_tokens_equal_transformers(case: Case, enforce_eager: bool) -> None:
    target, random_draft, prompts, expected = case
    engine, replays = draft_engine(target, target, enforce_eager)
    assert decode(engine, prompts, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)) == expected
    stats = engine.spec_stats
    assert stats.draft_tokens > 0 and stats.accepted_tokens == stats.draft_tokens
    if not enforce_eager:
        assert replays[1] > 0 and replays[2] > 0
    engine, _ = draft_engine(target, random_draft, enforce_eager)
    assert decode(engine, prompts, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)) == expected


def test_seeded_sampling_equals_without_speculation(case: Case) -> None:
    target, _, prompts, _ = case
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=NEW_TOKENS, ignore_eos=True)
    off = decode(LLMEngine(engine_config(str(target), dtype="float32", num_blocks=512)), prompts, params)
    engine, _ = draft_engine(target, target, enforce_eager=False)
    assert decode(engine, prompts, params) == off
    assert engine.spec_stats.accepted_tokens == engine.spec_stats.draft_tokens > 0
