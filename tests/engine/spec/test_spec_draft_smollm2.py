"""Draft-model speculation on the packaged SmolLM2 (the target): greedy output equals the output without speculation,
with SmolLM2 as its own draft (every proposal accepted) and with a random-weight draft of its vocabulary (almost
none)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from engine import LLM, SamplingParams

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"


@pytest.fixture(scope="module")
def random_draft(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    folder = tmp_path_factory.mktemp("smollm2-random-draft")
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    return folder


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # NOTE: on the shared 2-core test machine torch's spinning thread pool runs many times slower.
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(num_threads)


def test_greedy_equals_without_speculation(smollm2_path: Path, random_draft: Path) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=16)
    off = LLM(str(smollm2_path), num_blocks=64, max_model_len=256)
    (expected,) = off.generate(PROMPT, greedy, use_tqdm=False)
    del off
    for draft in (smollm2_path, random_draft):
        spec = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 4}
        on = LLM(str(smollm2_path), num_blocks=64, max_model_len=256, speculative_config=spec)
        (got,) = on.generate(PROMPT, greedy, use_tqdm=False)
        assert got.outputs[0].token_ids == expected.outputs[0].token_ids
        stats = on.engine.spec_stats
        assert stats.draft_tokens > 0
        if draft == smollm2_path:
            assert stats.accepted_tokens == stats.draft_tokens
        else:
            assert stats.accepted_tokens < 0.2 * stats.draft_tokens
