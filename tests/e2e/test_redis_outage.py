"""Acceptance 7: with Redis stopped mid-run requests keep succeeding (also while it comes back, empty, on
the same port); after the restart the pods register again and routing by the prefix directory resumes."""

from __future__ import annotations

import asyncio
import time

import grpc

from cli.cluster import LocalCluster
from client.generation_client import GenerationClient
from common.block_hash import block_extra_keys, hash_prompt_blocks
from common.prefix_directory import PrefixDirectory
from tests.e2e.support import (
    BLOCK_SIZE,
    HEARTBEAT_S,
    MIN_CACHED,
    PREFIX_TOKENS,
    REGISTRY_REFRESH_S,
    Oracle,
    run,
    run_concurrently,
    sequential,
    token_prefix,
    wait_until,
)

PROMPTS = [f"Question {i}: what is {i} plus {i}? Answer:" for i in range(6)]
REQUESTS = [{"prompt": p, "max_tokens": 4, "temperature": 0.0} for p in PROMPTS]
RESTART_WINDOW_S = 1.0
"""How long after the restart one-token requests keep coming, back to back: past the pods' next heartbeats
(they register again) and the router's next registry reads."""


NUM_QUICK_RESTARTS = 3


def cached_blocks(redis_url: str, token_ids: list[int], live: dict[str, int]) -> dict[str, int]:
    """The directory's answer for a prompt: leading blocks each live prefill pod holds."""

    async def lookup() -> dict[str, int]:
        directory = PrefixDirectory(redis_url)
        try:
            hashes = hash_prompt_blocks(token_ids, BLOCK_SIZE, block_extra_keys("smollm2-135m"))
            return await directory.longest_prefix(hashes, live)
        finally:
            await directory.aclose()

    return asyncio.run(lookup())


def registered_and_seen(cluster: LocalCluster) -> bool:
    """Every pod is in the registry again; then one router refresh later the router has read them all."""
    if sorted(p.pod_id for p in cluster.pod_infos()) != sorted(cluster.pod_ids):
        return False
    time.sleep(2 * REGISTRY_REFRESH_S)
    return True


def probe_after_restart(client: GenerationClient) -> list[tuple[float, str]]:
    """One-token requests back to back for RESTART_WINDOW_S; (seconds since the start, error) of each failure."""
    started = time.monotonic()
    failures: list[tuple[float, str]] = []
    while (elapsed := time.monotonic() - started) < RESTART_WINDOW_S:
        try:
            run(client, prompt=PROMPTS[0], max_tokens=1, temperature=0.0)
        except grpc.RpcError as exc:
            failures.append((round(elapsed, 2), f"{exc.code().name}: {exc.details()}"))
    return failures


def test_requests_keep_succeeding_while_redis_is_down_and_as_it_restarts(
    cluster: LocalCluster, client: GenerationClient, oracle: Oracle
) -> None:
    expected = [output.token_ids for output in oracle.greedy(PROMPTS, 4)]
    cluster.stop_redis()
    try:
        # NOTE: wait past the registry TTL (3 heartbeats), so the pods' entries would have lapsed too.
        time.sleep(4 * HEARTBEAT_S)
        assert [c.token_ids for c in run_concurrently(client, REQUESTS)] == expected
        prefix_during = sequential(client, token_prefix(seed=20), 2)
        assert len({c.metrics.prefill_pod_id for c in prefix_during}) == 1
        assert prefix_during[1].usage.cached_prompt_tokens >= MIN_CACHED
    finally:
        cluster.start_redis()
    failures = probe_after_restart(client)
    assert failures == [], f"{len(failures)} requests failed after the restart, first: {failures[:3]}"


def test_quick_redis_restarts_fail_no_request(cluster: LocalCluster, client: GenerationClient) -> None:
    # NOTE: whether a restart opens a gap depends on where the router's registry reads fall between the
    # pods' heartbeats, so a few restarts make one far more likely to show up.
    for restart in range(NUM_QUICK_RESTARTS):
        cluster.stop_redis()
        time.sleep(4 * HEARTBEAT_S)
        cluster.start_redis()
        failures = probe_after_restart(client)
        assert failures == [], f"restart {restart}: {len(failures)} requests failed, first: {failures[:3]}"


def test_directory_routing_resumes_after_redis_restarts(cluster: LocalCluster, client: GenerationClient) -> None:
    cluster.stop_redis()
    cluster.start_redis()
    assert wait_until(lambda: registered_and_seen(cluster), 5.0), cluster.pod_infos()
    prefix = token_prefix(seed=21)
    after = sequential(client, prefix, 4)
    served = [(c.metrics.prefill_pod_id, c.usage.cached_prompt_tokens) for c in after]
    assert len({pod for pod, _ in served}) == 1, served
    assert all(cached >= MIN_CACHED for _, cached in served[1:]), served
    live = {p.pod_id: p.generation for p in cluster.pod_infos() if p.role == "prefill"}

    def published() -> bool:
        return cached_blocks(cluster.redis_url, prefix, live).get(served[0][0], 0) >= PREFIX_TOKENS // BLOCK_SIZE

    assert wait_until(published, 5.0), cached_blocks(cluster.redis_url, prefix, live)
