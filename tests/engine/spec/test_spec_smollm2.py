"""Speculation on the packaged SmolLM2 through the offline API: n-gram proposals, stop strings cut where they cut
without speculation, n = 2 seeded sampling with log-probs gives the same completions."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from bench.offline.spec_acceptance import load_task_set
from engine import LLM, SamplingParams

PROMPTS = [
    "Repeat this list exactly: apple, banana, cherry, grape, lemon, mango. Again: apple, banana,",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
]
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def llms(smollm2_path: Path) -> Iterator[tuple[LLM, LLM]]:
    # NOTE: one thread: on the shared 2-core test machine torch's spinning thread pool runs many times slower.
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    off = LLM(str(smollm2_path), num_blocks=512, max_model_len=512)
    on = LLM(str(smollm2_path), num_blocks=512, max_model_len=512, speculative_config=NGRAM)
    yield off, on
    torch.set_num_threads(num_threads)


def test_greedy_with_stop_strings_equals_without_speculation(llms: tuple[LLM, LLM]) -> None:
    off, on = llms
    greedy = SamplingParams(temperature=0, max_tokens=20)
    full = off.generate(PROMPTS, greedy, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in on.generate(PROMPTS, greedy, use_tqdm=False)] == [
        o.outputs[0].token_ids for o in full
    ]
    # A stop string from the middle of each greedy text: the speculating engine must stop at the same token.
    stops = [o.outputs[0].text[len(o.outputs[0].text) // 2 :][:3] for o in full]
    for prompt, stop in zip(PROMPTS, stops, strict=True):
        params = SamplingParams(temperature=0, max_tokens=20, stop=(stop,))
        expected = off.generate(prompt, params, use_tqdm=False)[0].outputs[0]
        got = on.generate(prompt, params, use_tqdm=False)[0].outputs[0]
        assert (got.token_ids, got.text, got.finish_reason) == (expected.token_ids, expected.text, "stop")
    assert on.engine.spec_stats.accepted_tokens > 0
    assert on.engine.kv_cache_manager.num_free_blocks == on.engine.runner.num_blocks


def test_n2_seeded_sampling_equals_without_speculation(llms: tuple[LLM, LLM]) -> None:
    off, on = llms
    params = SamplingParams(n=2, temperature=0.7, seed=5, max_tokens=12, logprobs=True)
    expected = off.generate(PROMPTS[:1], params, use_tqdm=False)
    got = on.generate(PROMPTS[:1], params, use_tqdm=False)
    for want, have in zip(expected, got, strict=True):
        assert [c.token_ids for c in have.outputs] == [c.token_ids for c in want.outputs]
        for want_c, have_c in zip(want.outputs, have.outputs, strict=True):
            assert have_c.logprobs == pytest.approx(want_c.logprobs, abs=1e-4)


def test_sixteen_copy_heavy_prompts_equal_without_speculation(llms: tuple[LLM, LLM]) -> None:
    """Greedy, 16 prompts of mixed lengths from the W10 task sets (code edits, quoting summaries, extraction) plus the
    two above, batched: token for token the same, proposals accepted, the block pool free afterwards."""
    off, on = llms
    tasks = Path(__file__).resolve().parents[3] / "bench" / "offline" / "spec_tasks"
    prompts = (
        PROMPTS
        + [
            p for name in ("code_edit", "quote_summary", "extraction") for p in load_task_set(tasks / f"{name}.txt")[:5]
        ][:14]
    )
    assert len(prompts) == 16
    greedy = SamplingParams(temperature=0, max_tokens=12)
    before = on.engine.spec_stats.accepted_tokens
    got = [o.outputs[0].token_ids for o in on.generate(prompts, greedy, use_tqdm=False)]
    assert got == [o.outputs[0].token_ids for o in off.generate(prompts, greedy, use_tqdm=False)]
    assert on.engine.spec_stats.accepted_tokens > before
    assert on.engine.kv_cache_manager.num_free_blocks == on.engine.runner.num_blocks
