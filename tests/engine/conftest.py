"""Fixtures for engine tests: random-weight checkpoints and transformers' greedy outputs as the oracle."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.model_factory import NEW_TOKENS, hf_greedy, make_prompts, save_tiny_model


@pytest.fixture(scope="session", params=["llama", "qwen2", "qwen3"])
def tiny_model(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[list[int]], list[list[int]]]:
    """(folder, prompts, transformers' greedy outputs) for one random-weight architecture."""
    path = save_tiny_model(request.param, tmp_path_factory.mktemp(request.param))
    prompts = make_prompts(vocab_size=512)
    return path, prompts, hf_greedy(path, prompts, NEW_TOKENS)
