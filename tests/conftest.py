"""Shared test set-up: the `gpu` marker skips without CUDA; `smollm2_path` is the packaged model; `oracle` is the
offline engine's greedy outputs, built once per session (~8 s) for the end-to-end and fault tests; routers the tests
start run as one process unless a test asks for more."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.config import DEFAULT_MODEL
from engine.model_store import resolve_model
from tests.e2e.support import Oracle

# NOTE: a router's default process count comes from the cores (router.processes.router_process); the tests' routers
# (their admission limits, GetLoad's answers) must not change with the machine that runs them. Tests of several
# processes pass --workers; PDSERVE_ROUTER_WORKERS set outside wins.
os.environ.setdefault("PDSERVE_ROUTER_WORKERS", "1")


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


@pytest.fixture(scope="session")
def oracle() -> Oracle:
    return Oracle()
