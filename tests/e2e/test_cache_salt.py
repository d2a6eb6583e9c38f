"""A per-request cache_salt keys the prompt's block hashes end to end: the router's routing and directory lookup,
the prefill pod's prefix cache and the directory entries it publishes. Requests share cached KV only with
requests carrying the same salt."""

from __future__ import annotations

import asyncio

from cli.cluster import LocalCluster
from client.generation_client import GenerationClient
from common.block_hash import block_extra_keys, hash_prompt_blocks
from common.prefix_directory import PrefixDirectory
from tests.e2e.support import BLOCK_SIZE, Completion, run, token_prefix, wait_until

PREFIX_TOKENS = 128


def _salted(client: GenerationClient, prefix: list[int], suffix: int, salt: str | None) -> Completion:
    return run(client, token_ids=[*prefix, 5_000 + suffix], max_tokens=2, temperature=0.0, cache_salt=salt)


def _published_blocks(cluster: LocalCluster, prefix: list[int], salt: str, pod_id: str) -> int:
    """Leading blocks of `prefix`, hashed with `salt`, that the directory says `pod_id` holds."""
    live = {p.pod_id: p.generation for p in cluster.pod_infos() if p.role == "prefill"}

    async def lookup() -> int:
        directory = PrefixDirectory(cluster.redis_url)
        try:
            hashes = hash_prompt_blocks(prefix, BLOCK_SIZE, block_extra_keys("smollm2-135m", salt))
            return (await directory.longest_prefix(hashes, live)).get(pod_id, 0)
        finally:
            await directory.aclose()

    return asyncio.run(lookup())


def test_two_salts_do_not_share_cache_and_the_same_salt_does(cluster: LocalCluster, client: GenerationClient) -> None:
    prefix = token_prefix(seed=40)[:PREFIX_TOKENS]
    first = _salted(client, prefix, 0, "tenant-a")
    same = _salted(client, prefix, 1, "tenant-a")
    other = _salted(client, prefix, 2, "tenant-b")
    unsalted = _salted(client, prefix, 3, None)
    assert first.usage.cached_prompt_tokens == 0
    assert same.metrics.prefill_pod_id == first.metrics.prefill_pod_id
    assert same.usage.cached_prompt_tokens == PREFIX_TOKENS
    assert (other.usage.cached_prompt_tokens, unsalted.usage.cached_prompt_tokens) == (0, 0)
    pod_id = first.metrics.prefill_pod_id
    assert wait_until(
        lambda: _published_blocks(cluster, prefix, "tenant-a", pod_id) >= PREFIX_TOKENS // BLOCK_SIZE, 5.0
    )
