"""The offline API on the packaged SmolLM2: beam search as transformers does it, and best_of."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import LLM, SamplingParams
from tests.engine.beam.beam_oracle import hf_beam_search, load_hf


@pytest.fixture(scope="module")
def llm(smollm2_path: Path) -> LLM:
    return LLM(str(smollm2_path), num_blocks=128, max_model_len=256)


def test_beam_search_matches_transformers_on_smollm2(llm: LLM, smollm2_path: Path) -> None:
    prompt = llm.tokenizer.encode("The three primary colours are")
    params = SamplingParams(n=2, best_of=3, temperature=0.0, max_tokens=6, use_beam_search=True, length_penalty=0.8)
    (out,) = llm.generate([prompt], params, use_tqdm=False)
    expected = hf_beam_search(load_hf(llm.engine.model_path), prompt, params, list(llm.engine.info.eos_token_ids))
    assert [c.token_ids for c in out.outputs] == [b.token_ids for b in expected]
    scores = [(c.cumulative_logprob or 0.0) / len(c.token_ids) ** 0.8 for c in out.outputs]
    assert scores == pytest.approx([b.score for b in expected], abs=1e-4)
    assert [c.index for c in out.outputs] == [0, 1]
    assert out.outputs[0].text == llm.tokenizer.decode(out.outputs[0].token_ids, skip_special_tokens=True)


def test_best_of_returns_the_n_most_likely_samples(llm: LLM) -> None:
    params = SamplingParams(n=2, best_of=5, temperature=1.0, seed=11, max_tokens=5)
    (best,) = llm.generate("Once upon a time", params, use_tqdm=False)
    every = SamplingParams(n=5, temperature=1.0, seed=11, max_tokens=5, logprobs=True)
    (samples,) = llm.generate("Once upon a time", every, use_tqdm=False)
    ranked = sorted(samples.outputs, key=lambda c: -(c.cumulative_logprob or 0.0))[:2]
    assert [c.token_ids for c in best.outputs] == [c.token_ids for c in ranked]
    assert [c.index for c in best.outputs] == [0, 1]
    assert all(c.logprobs is None for c in best.outputs)
