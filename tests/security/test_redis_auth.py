"""Redis with a password (`redis://:password@host`), on a real redis-server: a client without the password is
refused, the pod registry with it works, and the URL is never printed with its password."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from cli.redis_server import RedisServer
from common.errors import UnavailableError
from common.pod_registry import PodInfo, PodRegistry
from common.redis_client import redact

PASSWORD = "s3cret-Pa55"


@pytest.fixture(scope="module")
def redis_with_password() -> Iterator[RedisServer]:
    with RedisServer(password=PASSWORD) as server:
        yield server


async def _register_and_list(redis_url: str) -> list[str]:
    registry = PodRegistry(redis_url, timeout_s=2.0)
    try:
        await registry.heartbeat(PodInfo("prefill-x", "prefill", "127.0.0.1:1", "m", 1))
        return [pod.pod_id for pod in await registry.list_pods()]
    finally:
        await registry.aclose()


def test_the_registry_works_with_the_password(redis_with_password: RedisServer) -> None:
    assert redis_with_password.url == f"redis://:{PASSWORD}@127.0.0.1:{redis_with_password.port}/0"
    assert asyncio.run(_register_and_list(redis_with_password.url)) == ["prefill-x"]


@pytest.mark.parametrize(
    ("auth", "refusal"),
    [("", "HELLO must be called with the client already authenticated"), (":wrong@", "invalid username-password")],
)
def test_a_client_without_the_password_is_refused(redis_with_password: RedisServer, auth: str, refusal: str) -> None:
    with pytest.raises(UnavailableError) as info:
        asyncio.run(_register_and_list(f"redis://{auth}127.0.0.1:{redis_with_password.port}/0"))
    assert refusal in str(info.value)
    assert PASSWORD not in str(info.value)


def test_redact_hides_the_password() -> None:
    assert redact(f"rediss://:{PASSWORD}@redis:6380/0?ssl_ca_certs=/ca.pem") == (
        "rediss://:***@redis:6380/0?ssl_ca_certs=/ca.pem"
    )
    assert redact("redis://user:pw@127.0.0.1/0") == "redis://user:***@127.0.0.1/0"
    assert redact("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
