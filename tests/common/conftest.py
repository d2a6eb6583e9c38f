"""Fixtures of the common/ tests: a real redis-server on a free port (see cli/redis_server.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cli.redis_server import RedisServer


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh, empty redis-server per test; tests may stop, restart, pause and resume it."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def anyio_backend() -> str:
    """Async tests (`pytest.mark.anyio`) run on asyncio only: the services are asyncio."""
    return "asyncio"
