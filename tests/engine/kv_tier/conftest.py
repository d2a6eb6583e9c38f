from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.model_factory import save_tiny_model


@pytest.fixture(scope="session")
def tiny_qwen3_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One random-weight float32 Qwen3 for the host tier's engine tests."""
    return save_tiny_model("qwen3", tmp_path_factory.mktemp("kv-tier-qwen3"))
