"""Mixture-of-experts models (Qwen3-MoE, Mixtral) are greedy token-identical to transformers on random float32
weights: batched, with prefix sharing (and a second pass served from the prefix cache), chunked prefill under async
scheduling, and preemption by recompute."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.models.moe import SparseMoeBlock
from tests.engine.model_factory import NEW_TOKENS, hf_greedy, make_prompts, save_tiny_model
from tests.engine.quant_support import greedy

SETTINGS: list[tuple[str, dict[str, Any]]] = [
    ("prefix-on-unchunked", {}),
    ("async-chunk-1-block", {"long_prefill_token_threshold": 16, "async_scheduling": True}),
    ("preemption", {"num_blocks": 40, "max_model_len": 400, "long_prefill_token_threshold": 64}),
]


Case = tuple[Path, list[list[int]], list[list[int]]]


def _case(name: str, tmp_path_factory: pytest.TempPathFactory) -> Case:
    """(folder, prompts, transformers' greedy outputs) of the named tiny model."""
    path = save_tiny_model(name, tmp_path_factory.mktemp(name))
    prompts = make_prompts(vocab_size=512)
    return path, prompts, hf_greedy(path, prompts, NEW_TOKENS)


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory: pytest.TempPathFactory) -> Case:
    return _case("qwen3_moe", tmp_path_factory)


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory: pytest.TempPathFactory) -> Case:
    return _case("mixtral", tmp_path_factory)


def _check_engine(case: Case, name: str, kwargs: dict[str, Any]) -> None:
    path, prompts, expected = case
    engine = LLMEngine(engine_config(str(path), **{"num_blocks": 4096, **kwargs}))
    assert any(isinstance(m, SparseMoeBlock) for m in engine.runner.model.modules())
    outputs = greedy(engine, prompts, NEW_TOKENS)
    assert [i for i, ref in enumerate(expected) if outputs[i] != ref] == []
    if name == "preemption":
        assert engine.scheduler.num_preemptions > 0
    if name == "prefix-on-unchunked":
        hits_before = engine.kv_cache_manager.stats.hits
        assert greedy(engine, prompts, NEW_TOKENS) == expected
        assert engine.kv_cache_manager.stats.hits > hits_before
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.num_blocks


@pytest.mark.parametrize(("name", "kwargs"), SETTINGS, ids=[s[0] for s in SETTINGS])
def test_qwen3_moe_matches_transformers(qwen3_moe: Case, name: str, kwargs: dict[str, Any]) -> None:
    _check_engine(qwen3_moe, name, kwargs)


def test_mixtral_matches_transformers(mixtral: Case) -> None:
    """The engine settings are architecture-blind: Mixtral (its routing and checkpoint names) runs the first."""
    _check_engine(mixtral, *SETTINGS[0])
