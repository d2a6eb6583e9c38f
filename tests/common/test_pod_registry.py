from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import pytest
import redis.asyncio as aioredis

from cli.redis_server import RedisServer
from common.errors import UnavailableError
from common.pod_registry import PodInfo, PodRegistry

pytestmark = pytest.mark.anyio

PREFILL = PodInfo(
    pod_id="prefill-0",
    role="prefill",
    address="10.0.0.1:50051",
    model="qwen3-0.6b",
    generation=111,
    num_free_blocks=900,
    num_total_blocks=1000,
)
DECODE = PodInfo(
    pod_id="decode-0",
    role="decode",
    address="10.0.0.2:50052",
    model="qwen3-0.6b",
    generation=222,
    kv_endpoint="10.0.0.2:60000",
    num_running=3,
    num_waiting=1,
    num_free_blocks=500,
    num_total_blocks=2000,
)


async def _wait_for_pods(registry: PodRegistry, expected: list[PodInfo], timeout_s: float = 2.0) -> None:
    deadline = time.monotonic() + timeout_s
    while await registry.list_pods() != expected:
        assert time.monotonic() < deadline, f"pods never became {expected}"
        await asyncio.sleep(0.02)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "common.pod_registry" and r.levelno == logging.WARNING]


def test_pod_info_json_round_trip_ignores_unknown_fields() -> None:
    raw = DECODE.to_json().replace('"pod_id"', '"from_a_newer_pod":1,"pod_id"')
    assert PodInfo.from_json(raw) == DECODE
    with pytest.raises(ValueError, match="role"):
        PodInfo(pod_id="x", role="router", address="a:1", model="m", generation=1)  # type: ignore[arg-type]


async def test_register_list_and_filter_by_role(redis_server: RedisServer) -> None:
    registry = PodRegistry(redis_server.url, key_prefix="t")
    try:
        await registry.register(PREFILL)
        await registry.register(DECODE)
        assert await registry.list_pods() == [DECODE, PREFILL]
        assert await registry.list_pods("prefill") == [PREFILL]
        assert await registry.list_pods("decode") == [DECODE]
        await registry.deregister("decode-0")
        assert await registry.list_pods() == [PREFILL]
    finally:
        await registry.aclose()


async def test_pod_that_stops_heartbeating_disappears_after_ttl(redis_server: RedisServer) -> None:
    registry = PodRegistry(redis_server.url, ttl_s=0.3, key_prefix="t")
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        await registry.register(PREFILL)
        for _ in range(9):
            await registry.heartbeat(DECODE)
            await asyncio.sleep(0.05)
        assert await registry.list_pods() == [DECODE]
        assert await raw.smembers("t:pods") == {b"decode-0"}
        await asyncio.sleep(0.35)
        assert await registry.list_pods() == []
        assert await raw.smembers("t:pods") == set()
    finally:
        await raw.aclose()
        await registry.aclose()


async def test_heartbeat_task_keeps_pod_alive_and_carries_draining_and_load(redis_server: RedisServer) -> None:
    registry = PodRegistry(redis_server.url, ttl_s=0.3, key_prefix="t")
    current = [PREFILL]
    try:
        registry.start_heartbeat(lambda: current[0], interval_s=0.05)
        await asyncio.sleep(0.5)
        assert await registry.list_pods() == [PREFILL]
        current[0] = dataclasses.replace(PREFILL, draining=True, num_running=7, num_free_blocks=12)
        await _wait_for_pods(registry, [current[0]])
        assert (await registry.list_pods("prefill"))[0].draining is True
        await registry.stop_heartbeat()
        await asyncio.sleep(0.35)
        assert await registry.list_pods() == []
    finally:
        await registry.aclose()


async def test_restarted_pod_replaces_its_generation(redis_server: RedisServer) -> None:
    registry = PodRegistry(redis_server.url, key_prefix="t")
    try:
        await registry.register(PREFILL)
        restarted = dataclasses.replace(PREFILL, generation=PREFILL.generation + 1)
        await registry.register(restarted)
        assert await registry.list_pods() == [restarted]
    finally:
        await registry.aclose()


async def test_heartbeat_rides_out_a_redis_outage_logging_once(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="common.pod_registry")
    registry = PodRegistry(redis_server.url, ttl_s=1.0, key_prefix="t", timeout_s=0.2)
    try:
        registry.start_heartbeat(lambda: DECODE, interval_s=0.03)
        await _wait_for_pods(registry, [DECODE])
        redis_server.stop()
        await asyncio.sleep(0.3)
        start = time.monotonic()
        with pytest.raises(UnavailableError):
            await registry.list_pods()
        assert time.monotonic() - start < 1.0
        assert len(_warnings(caplog)) == 1
        redis_server.start()
        await _wait_for_pods(registry, [DECODE])
        # NOTE: the beat lands in Redis before its task resumes to log the recovery.
        deadline = time.monotonic() + 1.0
        while "pod heartbeat recovered" not in caplog.messages and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        assert caplog.messages.count("pod heartbeat recovered") == 1
        assert len(_warnings(caplog)) == 1
    finally:
        await registry.aclose()
