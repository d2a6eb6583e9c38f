"""Greedy output is token-identical to transformers, and prompt logits match, across engine settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.scheduler_output import ScheduledRequest, SchedulerOutput
from tests.engine.model_factory import NEW_TOKENS, hf_greedy, make_prompts
from tests.engine.quant_support import greedy

GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)

# (name, engine kwargs): prefix caching on/off, chunk of one block / a few blocks / unlimited, and a pool
# small enough (40 blocks = 640 tokens for 16 prompts of up to 332 tokens) to force preemption.
SETTINGS: list[tuple[str, dict[str, Any]]] = [
    ("prefix-on-unchunked", {}),
    ("prefix-off-unchunked", {"enable_prefix_caching": False}),
    ("chunk-1-block", {"long_prefill_token_threshold": 16}),
    ("chunk-3-blocks", {"long_prefill_token_threshold": 48, "enable_prefix_caching": False}),
    ("preemption", {"num_blocks": 40, "max_model_len": 400, "long_prefill_token_threshold": 64}),
    # Async scheduling (the GPU default): step N+1 scheduled before step N's tokens are known.
    ("async-chunk-1-block", {"long_prefill_token_threshold": 16, "async_scheduling": True}),
    (
        "async-preemption",
        {"num_blocks": 40, "max_model_len": 400, "long_prefill_token_threshold": 64, "async_scheduling": True},
    ),
]


def assert_identical(outputs: list[list[int]], expected: list[list[int]]) -> None:
    mismatched = [i for i, ref in enumerate(expected) if outputs[i] != ref]
    assert not mismatched, f"prompts {mismatched} differ from transformers"


@pytest.mark.parametrize(("name", "kwargs"), SETTINGS, ids=[s[0] for s in SETTINGS])
def test_tiny_models_match_transformers(
    tiny_model: tuple[Path, list[list[int]], list[list[int]]], name: str, kwargs: dict[str, Any]
) -> None:
    path, prompts, expected = tiny_model
    engine = LLMEngine(engine_config(str(path), **{"num_blocks": 4096, **kwargs}))
    assert_identical(greedy(engine, prompts, NEW_TOKENS), expected)
    if name.endswith("preemption"):
        assert engine.scheduler.num_preemptions > 0
    if engine.config.cache.enable_prefix_caching:
        # A second pass over the same prompts is served from the prefix cache, with the same tokens.
        queries_before, hits_before = engine.kv_cache_manager.stats.queries, engine.kv_cache_manager.stats.hits
        assert_identical(greedy(engine, prompts, NEW_TOKENS), expected)
        assert engine.kv_cache_manager.stats.hits - hits_before > 0
        assert engine.kv_cache_manager.stats.queries > queries_before
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.num_blocks


# The real model's prompts: 8 of the 16 (1 to 300 tokens, block edges 16/17 and 64/65, three sharing the 64-token
# prefix); the tiny models run all 16. transformers' generate on the real model is the suite's heaviest set-up.
SMOLLM2_PROMPTS = (0, 3, 4, 7, 8, 9, 13, 15)


@pytest.fixture(scope="module")
def smollm2_case(smollm2_path: Path) -> tuple[Path, list[list[int]], list[list[int]]]:
    every = make_prompts(vocab_size=49152, seed=1)
    prompts = [every[i] for i in SMOLLM2_PROMPTS]
    return smollm2_path, prompts, hf_greedy(smollm2_path, prompts, NEW_TOKENS)


# The real model covers every dimension in three runs (the tiny models run the full matrix).
SMOLLM2_SETTINGS: list[tuple[str, dict[str, Any]]] = [
    SETTINGS[0],
    SETTINGS[2],
    (
        "preemption",
        {"num_blocks": 40, "max_model_len": 400, "long_prefill_token_threshold": 48, "enable_prefix_caching": False},
    ),
]


# NOTE: preemption on the real model (~30 s on 2 cores) is a soak case: the tiny models run it in the default suite.
SMOLLM2_CASES = [
    pytest.param(name, kwargs, id=name, marks=[pytest.mark.soak] if name == "preemption" else [])
    for name, kwargs in SMOLLM2_SETTINGS
]


@pytest.mark.parametrize(("name", "kwargs"), SMOLLM2_CASES)
def test_smollm2_matches_transformers(
    smollm2_case: tuple[Path, list[list[int]], list[list[int]]], name: str, kwargs: dict[str, Any]
) -> None:
    path, prompts, expected = smollm2_case
    engine = LLMEngine(engine_config(str(path), **{"num_blocks": 1024, **kwargs}))
    assert_identical(greedy(engine, prompts, NEW_TOKENS), expected)
    if name == "preemption":
        assert engine.scheduler.num_preemptions > 0
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.num_blocks


def _prompt_logits_in_chunks(engine: LLMEngine, prompt: list[int], chunk: int) -> torch.Tensor:
    """Logits at every prompt position, computed chunk by chunk through the paged KV path."""
    kv = engine.kv_cache_manager
    kv.allocate_slots("logits", len(prompt))
    logits = []
    for start in range(0, len(prompt), chunk):
        tokens = prompt[start : start + chunk]
        step = SchedulerOutput(
            [ScheduledRequest("logits", tokens, start, kv.get_block_ids("logits"), GREEDY, False, prompt, [])]
        )
        inputs = engine.runner.prepare_inputs(step)
        with torch.inference_mode():
            hidden = engine.runner.model(inputs.input_ids, inputs.positions, engine.runner.kv_caches, inputs.metadata)
            logits.append(engine.runner.model.compute_logits(hidden))
    kv.free("logits")
    return torch.cat(logits)


@pytest.mark.parametrize("chunk", [300, 16, 37])
def test_prompt_logits_match_transformers(smollm2_path: Path, chunk: int) -> None:
    from transformers import AutoModelForCausalLM

    prompt = make_prompts(vocab_size=49152, seed=2)[-1]
    hf = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = hf(torch.tensor([prompt])).logits[0]
    engine = LLMEngine(engine_config(str(smollm2_path), num_blocks=64))
    actual = _prompt_logits_in_chunks(engine, prompt, chunk)
    assert actual.shape == expected.shape
    assert torch.allclose(actual, expected, atol=1e-4, rtol=0), (actual - expected).abs().max()
