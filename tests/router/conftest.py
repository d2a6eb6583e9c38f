"""Fixtures of the router tests: a real redis-server, the model's tokenizer, one tokenizer pool per module."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerBase

from cli.redis_server import RedisServer
from router.tokenizer_pool import TokenizerPool, load_tokenizer


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """Async tests run on asyncio (the services are asyncio); module scope lets async fixtures be shared."""
    return "asyncio"


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh, empty redis-server per test; tests may stop and restart it."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def tokenizer(smollm2_path: Path) -> PreTrainedTokenizerBase:
    return load_tokenizer(smollm2_path)


@pytest.fixture(scope="module")
async def tokenizer_pool(smollm2_path: Path, anyio_backend: str) -> AsyncIterator[TokenizerPool]:
    pool = TokenizerPool(smollm2_path, size=2)
    await pool.start()
    try:
        yield pool
    finally:
        await pool.aclose()
