"""Acceptance 8: a decode pod started while the cluster runs receives requests within 5 s; a decode pod
stopped with SIGTERM while requests are in flight finishes them, drops out of routing, and no request fails."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cli.cluster import LocalCluster
from client.generation_client import GenerationClient
from tests.e2e.support import Oracle, run, run_concurrently, wait_until

JOIN_BOUND_S = 5.0
PROMPTS = [f"Item {i}: a list of things to pack for a trip to the mountains:" for i in range(8)]


def short_requests(count: int) -> list[dict[str, Any]]:
    return [{"prompt": f"Count to {i}:", "max_tokens": 2, "temperature": 0.0} for i in range(count)]


def test_a_new_decode_pod_receives_requests_within_5_s(cluster: LocalCluster, client: GenerationClient) -> None:
    pod_id = cluster.add_pod("decode")
    joined_at = time.monotonic()
    seen: set[str] = set()
    while pod_id not in seen and time.monotonic() - joined_at < JOIN_BOUND_S:
        seen |= {c.metrics.decode_pod_id for c in run_concurrently(client, short_requests(4))}
    assert pod_id in seen, (pod_id, seen)
    assert time.monotonic() - joined_at < JOIN_BOUND_S


def test_a_sigtermed_decode_pod_finishes_its_requests_and_leaves_routing(
    cluster: LocalCluster, client: GenerationClient, oracle: Oracle
) -> None:
    expected = [output.token_ids for output in oracle.greedy(PROMPTS, 24)]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        futures = [pool.submit(run, client, prompt=p, max_tokens=24, temperature=0.0) for p in PROMPTS]
        assert wait_until(lambda: any(p.role == "decode" and p.num_running > 0 for p in cluster.pod_infos()), 30.0)
        busy = max((p for p in cluster.pod_infos() if p.role == "decode"), key=lambda p: p.num_running)
        stopped = cluster.stop_pod(busy.pod_id, wait=False)
        completions = [future.result() for future in futures]
    assert stopped.wait_or_kill(35.0) == 0
    assert [c.token_ids for c in completions] == expected
    assert busy.pod_id in {c.metrics.decode_pod_id for c in completions}
    assert busy.pod_id not in {p.pod_id for p in cluster.pod_infos()}
    after = run_concurrently(client, short_requests(8))
    assert busy.pod_id not in {c.metrics.decode_pod_id for c in after}
