"""Fixtures of the engine core tests: one random-weight qwen3 checkpoint (the engine needs no tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.model_factory import save_tiny_model


@pytest.fixture(scope="session")
def core_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model("qwen3", tmp_path_factory.mktemp("core-qwen3"))
