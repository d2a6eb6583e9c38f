"""Fixtures of the decode pod tests: a tiny random-weight model, a fresh redis-server per test, asyncio only."""

from __future__ import annotations

from tests.decode_service.pod_pair import anyio_backend, redis_server, tiny_model

__all__ = ["anyio_backend", "redis_server", "tiny_model"]
