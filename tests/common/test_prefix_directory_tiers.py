"""The prefix directory's host tier: a pod's run continues through blocks in its host tier, each counted at the
host-hit weight; tiers are published, removed, cleared, dropped and refreshed apart."""

from __future__ import annotations

import pytest

from cli.redis_server import RedisServer
from common.kv_cache_events import HOST_TIER, AllBlocksCleared, BlockRemoved, BlockStored
from common.prefix_directory import PrefixDirectory
from tests.common.test_prefix_directory import LIVE, H

pytestmark = pytest.mark.anyio


async def test_host_tier_blocks_extend_the_run_at_their_weight(redis_server: RedisServer) -> None:
    directory = PrefixDirectory(redis_server.url, key_prefix="tiers", host_hit_weight=0.25)
    try:
        # A: h0, h1 on the device, h2, h3 moved to its host tier (h4 evicted); B: h0..h2 on the device.
        assert await directory.publish(
            "A",
            1,
            [
                BlockStored(tuple(H), None),
                BlockRemoved(tuple(H[2:])),
                BlockStored((H[3], H[2]), None, HOST_TIER),
            ],
        )
        assert await directory.publish("B", 7, [BlockStored(tuple(H[:3]), None)])
        assert await directory.longest_prefix(H, LIVE) == {"A": 2 + 0.25 * 2, "B": 3}
        # h2 is copied back to A's device (it stays in the host tier too): a device block counts whole.
        assert await directory.publish("A", 1, [BlockStored((H[2],), H[1])])
        assert await directory.longest_prefix(H, LIVE) == {"A": 3 + 0.25, "B": 3}
        assert await directory.publish("A", 1, [BlockRemoved((H[3],), HOST_TIER)])
        assert await directory.longest_prefix(H, LIVE) == {"A": 3, "B": 3}
        assert await directory.refresh("A", 1)
        assert await directory.publish("A", 1, [BlockStored((H[3],), None, HOST_TIER)])
        assert await directory.longest_prefix(H, LIVE) == {"A": 3.25, "B": 3}
        assert await directory.publish("A", 1, [AllBlocksCleared()])
        assert await directory.longest_prefix(H, LIVE) == {"A": 0, "B": 3}
        assert await directory.publish("B", 7, [BlockStored((H[3],), None, HOST_TIER)])
        assert await directory.drop_pod("B", 7)
        assert await directory.longest_prefix(H, LIVE) == {"A": 0, "B": 0}
    finally:
        await directory.aclose()
