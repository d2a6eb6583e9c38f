"""The host tier of KV blocks (`--swap-space`) over real processes, seen through the pods' /metrics.

Its own cluster (1 prefill + 1 decode pod, the router, Redis), every pod with a pool of 16 blocks (256 tokens) and a
host tier, /metrics on free ports:
(a) swap on preemption: 4 greedy requests of 45 to 63 prompt + 60 output tokens (7 or 8 blocks each at the end)
    decoded at once on the decode pod preempt each other; every preemption swaps (`--swap-min-tokens 16`). Each output
    equals the same request run alone, the decode pod counted swapped-out and swapped-in blocks, and at the end every
    device block and every host slot a swap held is free again. NOTE: the prompts' lengths differ so that the
    requests cross block boundaries at different steps: a victim's last block is then partial, never in the prefix
    cache, and its readmission copies it back from the host.
(b) host prefix tier: a 100-token prompt's cached blocks, pushed out of the prefill pod's device pool by 3 other
    prompts, are found in its host tier when the prompt comes again: copied back, not recomputed, same output.
NOTE: soak: with a cluster of its own (about 20 s to start) the module takes 40 s to 2 minutes on CI's 2 shared
cores; the default run checks the same paths in process (tests/engine/kv_tier/, tests/pod/test_front_metrics.py,
tests/observability/test_metrics.py).
"""

from __future__ import annotations

import random
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli.cluster import LocalCluster
from client.generation_client import GenerationClient
from tests.e2e.support import HEARTBEAT_S, cluster_config, run, run_concurrently, wait_until

pytestmark = pytest.mark.soak

NUM_BLOCKS = 16
POD_ARGS = (
    *("--heartbeat-s", str(HEARTBEAT_S), "--num-blocks", str(NUM_BLOCKS)),
    *("--swap-space", "0.05", "--swap-min-tokens", "16"),
)
SWAP_PROMPT_TOKENS = (45, 51, 57, 63)
SWAP_MAX_TOKENS = 60
PREFIX_PROMPT_TOKENS = 100
METRICS_WAIT_S = 10.0
HOST_HITS = ("pdserve:host_prefix_cache_hits_total", ())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    config = cluster_config(tmp_path_factory.mktemp("kv-tier-logs"), metrics_port=0)
    with LocalCluster(config) as local_cluster:
        yield local_cluster


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[GenerationClient]:
    with GenerationClient(cluster.router_address) as generation_client:
        yield generation_client


def _metrics_url(cluster: LocalCluster, role: str) -> str:
    (url,) = [url for name, url in cluster.metrics_urls.items() if name.startswith(role)]
    return url


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted((k, v) for k, v in sample.labels.items() if k != "role"))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _prompt(seed: int, num_tokens: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1_000, 30_000) for _ in range(num_tokens)]


def _greedy(token_ids: list[int], max_tokens: int) -> dict[str, Any]:
    return {"token_ids": token_ids, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}


def test_requests_swapped_out_and_back_in_on_the_decode_pod_match_their_runs_alone(
    cluster: LocalCluster, client: GenerationClient
) -> None:
    requests = [_greedy(_prompt(seed, n), SWAP_MAX_TOKENS) for seed, n in enumerate(SWAP_PROMPT_TOKENS)]
    alone = [run(client, **request).token_ids for request in requests]
    assert all(len(tokens) == SWAP_MAX_TOKENS for tokens in alone)
    decode = _metrics_url(cluster, "decode")
    before = _scrape(decode)
    together = [completion.token_ids for completion in run_concurrently(client, requests)]
    assert together == alone

    def drained() -> bool:
        after = _scrape(decode)
        return after[("pdserve:kv_cache_usage_perc", ())] == 0.0 and after[("pdserve:num_requests_running", ())] == 0

    assert wait_until(drained, METRICS_WAIT_S), "the decode pod's KV blocks did not all come back"
    after = _scrape(decode)

    def moved(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    assert moved("pdserve:num_preemptions_total", mode="swap") > 0
    assert moved("pdserve:num_preemptions_total", mode="recompute") == 0
    # NOTE: a swap of 16+ computed tokens moves at least one block each way.
    num_swaps = moved("pdserve:num_preemptions_total", mode="swap")
    assert moved("pdserve:kv_swapped_out_blocks_total") >= num_swaps
    assert 0 < moved("pdserve:kv_swapped_in_blocks_total") <= moved("pdserve:kv_swapped_out_blocks_total")
    assert after[("pdserve:host_kv_cache_blocks", (("state", "swapped"),))] == 0


def test_a_prefix_evicted_from_the_prefill_pods_device_pool_is_served_from_its_host_tier(
    cluster: LocalCluster, client: GenerationClient
) -> None:
    prefill = _metrics_url(cluster, "prefill")
    prompt = _greedy(_prompt(100, PREFIX_PROMPT_TOKENS), 4)
    first = run(client, **prompt).token_ids
    # 3 prompts of 7 blocks each take more than the 16-block pool: the first prompt's cached blocks are evicted.
    for seed in (101, 102, 103):
        run(client, **_greedy(_prompt(seed, PREFIX_PROMPT_TOKENS), 4))
    before = _scrape(prefill)
    assert before[("pdserve:host_kv_cache_blocks", (("state", "cached"),))] > 0
    again = run(client, **prompt)
    assert again.token_ids == first

    def host_hits() -> float:
        return _scrape(prefill)[HOST_HITS] - before[HOST_HITS]

    assert wait_until(lambda: host_hits() > 0, METRICS_WAIT_S), "no prefix hit in the host tier"
    # Only full blocks are cached, and the last prompt token is always computed: at most 6 blocks of 16 tokens.
    assert host_hits() % 16 == 0 and host_hits() <= 96
    assert again.usage.cached_prompt_tokens >= host_hits()
