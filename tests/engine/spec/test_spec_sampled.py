"""Speculative decoding keeps sampled output exact: the target model's distribution, the seeded tokens themselves.

Each verified position is sampled as it would be without speculation (same seed, position and history), and the
proposals are accepted up to the first one that differs from its position's sample. For a deterministic proposer
(draft distribution q a point mass on d) that is the standard rejection rule: d is kept with probability p(d), and
on rejection the token is drawn from p without d, renormalized, i.e. normalize(max(p - q, 0)).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.pending_output import PendingOutput
from engine.sampler import Sampler, SamplingBatch
from tests.engine.model_factory import make_prompts

VOCAB = 24
CHI2_CRITICAL_DF23_P001 = 49.73
"""The chi-square value that 23 degrees of freedom exceed with probability 0.001."""


@pytest.fixture(scope="module")
def small_vocab_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=256,
    )
    folder = tmp_path_factory.mktemp("qwen3-vocab24")
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    return folder


def run(engine: LLMEngine, requests: list[tuple[list[int], SamplingParams]]) -> list[list[int]]:
    for i, (prompt, params) in enumerate(requests):
        engine.add_request(str(i), prompt, params)
    tokens: list[list[int]] = [[] for _ in requests]
    while engine.has_unfinished_requests():
        for output in engine.step():
            tokens[int(output.req_id)] += output.new_token_ids
    assert engine.kv_cache_manager.num_free_blocks == engine.runner.num_blocks
    return tokens


def test_seeded_sampled_tokens_equal_without_speculation(small_vocab_model: Path) -> None:
    """Two seeds per prompt (as n = 2 submits them), with top-k and a repetition penalty among them."""
    prompts = make_prompts(VOCAB)[2:8]
    variants = [
        SamplingParams(temperature=0.8, seed=11, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=1.0, top_k=8, repetition_penalty=1.3, seed=12, max_tokens=12, ignore_eos=True),
    ]
    requests = [(prompt, params) for prompt in prompts for params in variants]
    off = run(LLMEngine(engine_config(str(small_vocab_model), num_blocks=256)), requests)
    spec = {"method": "replay", "replay_corruption": 0.3, "num_speculative_tokens": 3}
    engine = LLMEngine(engine_config(str(small_vocab_model), num_blocks=256, speculative_config=spec))
    # NOTE: the first variant's output is its prompt's recording, so the second's proposals mostly miss.
    engine.set_replay_recordings({tuple(p): off[2 * i] for i, p in enumerate(prompts)})
    assert run(engine, requests) == off
    assert 0 < engine.spec_stats.accepted_tokens < engine.spec_stats.draft_tokens


def chi2(samples: np.ndarray, expected: np.ndarray) -> float:
    observed = np.bincount(samples, minlength=len(expected))
    return float((((observed - len(samples) * expected) ** 2) / (len(samples) * expected)).sum())


def test_verified_token_distribution_is_the_target_s() -> None:
    """Chi-square of 20,000 seeded verifications of a proposed token d against the target distribution p (24 tokens,
    23 degrees of freedom, critical value at p = 0.001): the first emitted token must follow p exactly.

    The test can fail: on the same seeds, accepting d always (or with probability q(d) = 1 instead of p(d)) puts
    every sample on d, and drawing a fresh token from p after a rejection (not from the residual) gives d about
    p(d) * (2 - p(d)); both are checked to exceed the critical value by far.
    """
    torch.manual_seed(0)
    target_logits = torch.randn(VOCAB) * 1.5
    p = target_logits.double().softmax(0).numpy()
    draft = int(np.argsort(p)[-3])
    num_samples, position = 20000, 40
    logits = target_logits.repeat(2 * num_samples, 1)
    params = SamplingParams(temperature=1.0, seed=0)
    batch = SamplingBatch(
        params=[params] * (2 * num_samples),
        seeds=[seed for seed in range(num_samples) for _ in range(2)],
        positions=[position, position + 1] * num_samples,
        prompt_token_ids=[[]] * (2 * num_samples),
        output_token_ids=[[]] * (2 * num_samples),
    )
    req_ids = [str(i) for i in range(num_samples)]
    output = PendingOutput(req_ids, Sampler()(logits, batch), [[draft]] * num_samples).result()
    first = np.array([(output.accepted_token_ids[r] or [output.sampled_token_ids[r]])[0] for r in req_ids])
    accepted = np.array([bool(output.accepted_token_ids[r]) for r in req_ids])
    assert chi2(first, p) < CHI2_CRITICAL_DF23_P001
    assert abs(accepted.mean() - p[draft]) < 4 * (p[draft] * (1 - p[draft]) / num_samples) ** 0.5
    always_accepted = np.full(num_samples, draft)
    assert chi2(always_accepted, p) > 10 * CHI2_CRITICAL_DF23_P001
    fresh_draw = np.random.default_rng(0).choice(VOCAB, size=num_samples, p=p)
    resampled_from_p = np.where(accepted, draft, fresh_draw)
    assert chi2(resampled_from_p, p) > 2 * CHI2_CRITICAL_DF23_P001
