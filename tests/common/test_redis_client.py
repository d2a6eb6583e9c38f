"""common.redis_client against a real redis-server: a burst of calls shares a bounded pool of connections."""

from __future__ import annotations

import asyncio

import pytest

from cli.redis_server import RedisServer
from common.redis_client import MAX_CONNECTIONS, open_redis


@pytest.mark.anyio
async def test_a_burst_of_calls_opens_at_most_max_connections(redis_server: RedisServer) -> None:
    client = open_redis(redis_server.url, timeout_s=5.0)
    observer = open_redis(redis_server.url, timeout_s=5.0)
    try:
        before = len(await observer.client_list())
        assert all(await asyncio.gather(*(client.ping() for _ in range(4 * MAX_CONNECTIONS))))
        assert 1 <= len(await observer.client_list()) - before <= MAX_CONNECTIONS
    finally:
        await client.aclose()
        await observer.aclose()
