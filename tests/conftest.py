"""Shared test set-up: the `gpu` marker skips without CUDA; `smollm2_path` is the packaged model."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import DEFAULT_MODEL
from engine.model_store import resolve_model


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    # NOTE: torch is imported only when GPU tests were collected, so CPU-only runs start fast.
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The converted SmolLM2-135M-Instruct folder (converted on first use, ~1 min, then cached)."""
    return resolve_model(DEFAULT_MODEL)
