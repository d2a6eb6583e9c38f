from __future__ import annotations

import asyncio
import logging
import time

import pytest
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from cli.redis_server import RedisServer
from common.block_hash import block_extra_keys, hash_prompt_blocks
from common.kv_cache_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from common.prefix_directory import PrefixDirectory

pytestmark = pytest.mark.anyio

H = hash_prompt_blocks(list(range(5 * 16)), block_size=16, extra_keys=block_extra_keys("qwen3-0.6b"))
OTHER = hash_prompt_blocks(list(range(100, 116)), block_size=16, extra_keys=block_extra_keys("qwen3-0.6b"))
LIVE = {"A": 1, "B": 7}


async def _publish_a_and_b(directory: PrefixDirectory) -> None:
    """A holds h0..h4; B holds h0, h1 and h3 (not h2)."""
    assert await directory.publish("A", 1, [BlockStored(tuple(H), None)])
    assert await directory.publish("B", 7, [BlockStored(tuple(H[:2]), None), BlockStored((H[3],), H[2])])


async def test_longest_prefix_counts_leading_blocks_only(redis_server: RedisServer) -> None:
    directory = PrefixDirectory(redis_server.url, key_prefix="t")
    try:
        await _publish_a_and_b(directory)
        assert await directory.longest_prefix(H, LIVE) == {"A": 5, "B": 2}
        assert await directory.longest_prefix(H[:3], {"A": 1, "B": 7, "C": 3}) == {"A": 3, "B": 2, "C": 0}
        assert await directory.longest_prefix(OTHER, LIVE) == {"A": 0, "B": 0}
        assert await directory.longest_prefix([], LIVE) == {"A": 0, "B": 0}
        assert await directory.longest_prefix(H, {}) == {}
        stats = directory.stats
        assert (stats.lookups, stats.hits, stats.errors, stats.publishes, stats.publish_errors) == (5, 2, 0, 2, 0)
        assert 0 < stats.last_latency_s < 0.5
    finally:
        await directory.aclose()


async def test_removal_and_clear_shrink_the_prefix(redis_server: RedisServer) -> None:
    directory = PrefixDirectory(redis_server.url, key_prefix="t")
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        await _publish_a_and_b(directory)
        assert await directory.publish("A", 1, [BlockRemoved((H[2],))])
        assert await directory.longest_prefix(H, LIVE) == {"A": 2, "B": 2}
        assert await directory.publish("B", 7, [BlockRemoved((H[0],))])
        assert await directory.longest_prefix(H, LIVE) == {"A": 2, "B": 0}
        assert await directory.publish("A", 1, [AllBlocksCleared(), BlockStored((H[0],), None)])
        assert await directory.longest_prefix(H, LIVE) == {"A": 1, "B": 0}
        assert await raw.smembers("t:podblk:A:1") == {H[0].hex().encode()}
        assert await raw.zrange(f"t:blk:{H[3].hex()}", 0, -1) == [b"B:7"]
    finally:
        await raw.aclose()
        await directory.aclose()


async def test_old_generations_and_dead_pods_never_win(redis_server: RedisServer) -> None:
    directory = PrefixDirectory(redis_server.url, key_prefix="t")
    try:
        await _publish_a_and_b(directory)
        assert await directory.publish("D", 1, [BlockStored(tuple(H), None)])
        assert await directory.longest_prefix(H, {"A": 2, "B": 7}) == {"A": 0, "B": 2}
        assert await directory.drop_pod("A", 1)
        assert await directory.longest_prefix(H, LIVE) == {"A": 0, "B": 2}
    finally:
        await directory.aclose()


async def test_entries_expire_unless_refreshed(redis_server: RedisServer) -> None:
    directory = PrefixDirectory(redis_server.url, key_prefix="t", entry_ttl_s=0.3)
    try:
        await _publish_a_and_b(directory)
        directory.start_refresh("A", 1, interval_s=0.05)
        await asyncio.sleep(0.45)
        assert await directory.longest_prefix(H, LIVE) == {"A": 5, "B": 0}
    finally:
        await directory.aclose()


async def test_lookup_is_one_evalsha_round_trip_that_stops_early(redis_server: RedisServer) -> None:
    # NOTE: a generous timeout: a reconnect under CPU load would add handshake commands to the count.
    directory = PrefixDirectory(redis_server.url, key_prefix="t", timeout_s=5.0)
    other = aioredis.Redis.from_url(redis_server.url)
    reader, writer = await asyncio.open_connection("127.0.0.1", redis_server.port)
    try:
        await _publish_a_and_b(directory)
        assert await directory.longest_prefix(H, LIVE) == {"A": 5, "B": 2}  # loads the script
        await other.ping()
        writer.write(b"MONITOR\r\n")
        assert await reader.readline() == b"+OK\r\n"
        assert await directory.longest_prefix(H, LIVE) == {"A": 5, "B": 2}
        assert await directory.longest_prefix([OTHER[0], *H], LIVE) == {"A": 0, "B": 0}
        await other.echo("end-of-lookup")
        lines: list[str] = []
        while "end-of-lookup" not in (line := (await reader.readline()).decode()):
            lines.append(line)
        client_commands = [line.split('"')[1] for line in lines if "lua]" not in line]
        client_commands = [c for c in client_commands if c.upper() not in ("HELLO", "CLIENT", "SELECT")]
        assert client_commands == ["EVALSHA", "EVALSHA"]
        # 5 blocks for the first lookup; the second stops after its first block, which no pod holds.
        assert sum('"ZMSCORE"' in line for line in lines) == 6
    finally:
        writer.close()
        await other.aclose()
        await directory.aclose()


async def test_publish_is_one_pipelined_round_trip(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = PrefixDirectory(redis_server.url, key_prefix="t")
    executed: list[int] = []
    original = Pipeline.execute

    async def counting_execute(pipe: Pipeline, raise_on_error: bool = True) -> list[object]:
        executed.append(len(pipe))
        return await original(pipe, raise_on_error)

    monkeypatch.setattr(Pipeline, "execute", counting_execute)
    try:
        events: list[KVCacheEvent] = [
            BlockStored(tuple(H[:3]), None),
            BlockRemoved((H[1],)),
            AllBlocksCleared(),
            BlockStored((H[0],), None),
        ]
        assert await directory.publish("A", 1, events)
        # one round trip of three commands: the stores and the removal before the clear (one EVAL), the clear
        # (EVAL), the store after it (EVAL)
        assert executed == [3]
        assert await directory.longest_prefix(H, {"A": 1}) == {"A": 1}
    finally:
        await directory.aclose()


async def test_redis_down_fails_soft_and_fast_then_recovers(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="common.prefix_directory")
    directory = PrefixDirectory(redis_server.url, key_prefix="t", timeout_s=0.2)
    try:
        await _publish_a_and_b(directory)
        redis_server.stop()
        start = time.monotonic()
        assert await directory.longest_prefix(H, LIVE) == {}
        assert await directory.publish("A", 1, [BlockRemoved((H[4],))]) is False
        assert await directory.longest_prefix(H, LIVE) == {}
        assert time.monotonic() - start < 1.0
        assert [r.name for r in caplog.records if r.levelno >= logging.WARNING] == ["common.prefix_directory"]
        redis_server.start()
        # Redis came back empty: the pod's next publish rewrites its whole state (A: h0..h3).
        assert await directory.longest_prefix(H, LIVE) == {"A": 0, "B": 0}
        assert await directory.publish("A", 1, [])
        assert await directory.longest_prefix(H, LIVE) == {"A": 4, "B": 0}
        assert await directory.refresh("B", 7)
        assert await directory.longest_prefix(H, LIVE) == {"A": 4, "B": 2}
        stats = directory.stats
        assert (stats.lookups, stats.hits, stats.errors, stats.publish_errors) == (5, 2, 2, 1)
    finally:
        await directory.aclose()


async def test_paused_redis_times_out_then_answers_again(redis_server: RedisServer) -> None:
    directory = PrefixDirectory(redis_server.url, key_prefix="t", timeout_s=0.2)
    try:
        await _publish_a_and_b(directory)
        redis_server.pause()
        start = time.monotonic()
        assert await directory.longest_prefix(H, LIVE) == {}
        assert time.monotonic() - start < 1.0
        redis_server.resume()
        assert await directory.longest_prefix(H, LIVE) == {"A": 5, "B": 2}
        stats = directory.stats
        assert (stats.lookups, stats.hits, stats.errors, stats.publishes, stats.publish_errors) == (2, 1, 1, 2, 0)
    finally:
        await directory.aclose()
