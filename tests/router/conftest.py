"""Fixtures of the router tests: a real redis-server, the model's tokenizer and ModelInfo, one tokenizer pool per
module, and the token ids of a short text."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerBase

from cli.redis_server import RedisServer
from router.model_info import ModelInfo
from router.tokenizer.tokenizer_pool import TokenizerPool, load_tokenizer
from tests.router.fake_pods import BLOCK_SIZE, MODEL
from tests.router.lifecycle_support import TEXT


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


@pytest.fixture(scope="module")
def model(smollm2_path: Path) -> ModelInfo:
    return ModelInfo.from_folder(MODEL, smollm2_path, BLOCK_SIZE)


@pytest.fixture(scope="module")
def output_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The token ids of TEXT: what the scripted pods answer."""
    ids: list[int] = tokenizer.encode(TEXT)
    return ids
