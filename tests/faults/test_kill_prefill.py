"""kill -9 a prefill pod mid-prefill (2 prefill + 1 decode pods, long prompts): its requests are retried on the
other prefill pod and complete with the greedy tokens of an unfailed run; the decode pod's KV returns to baseline
within the lease bound (the router Releases each reservation whose prefill failed, at once).

The default run uses 4 prompts of 384 tokens; the acceptance shape (4 prompts of 1,500 tokens: 376 of the decode
pod's 512 blocks) is a soak.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from cli.cluster import LocalCluster
from client.generation_client import GenerationClient
from tests.e2e.support import Oracle
from tests.faults.support import (
    SOAK_TIMEOUT_S,
    fault_cluster,
    join_streams,
    kill,
    kv_at_baseline,
    pods_of,
    random_prompt,
    seconds_to_serve,
    seconds_until,
    start_streams,
)

KV_LEASE_S = 30.0
"""The pods' default --kv-lease-s: the bound within which a stranded reservation is freed."""
MAX_TOKENS = 8

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with fault_cluster(tmp_path_factory.mktemp("kill-prefill-logs"), num_prefill=2, num_decode=1) as local:
        yield local


def _busy_prefill_pod(cluster: LocalCluster) -> str | None:
    busy = [pod.pod_id for pod in pods_of(cluster, "prefill") if pod.num_running + pod.num_waiting > 0]
    return busy[0] if busy else None


def _kill_mid_prefill(
    cluster: LocalCluster, client: GenerationClient, oracle: Oracle, num_requests: int, num_prompt_tokens: int
) -> dict[str, float | int | None]:
    prompts = [random_prompt(100 + seed, num_prompt_tokens) for seed in range(num_requests)]
    expected = [output.token_ids for output in oracle.greedy(prompts, MAX_TOKENS)]
    requests = [{"token_ids": p, "max_tokens": MAX_TOKENS, "temperature": 0.0} for p in prompts]
    streams = start_streams(client, requests)
    assert seconds_until(lambda: _busy_prefill_pod(cluster) is not None, 60.0) is not None
    victim = _busy_prefill_pod(cluster)
    assert victim is not None
    killed_at = kill(cluster, victim)
    to_serve = seconds_to_serve(client, random_prompt(3000, 8), 60.0)
    join_streams(streams)
    done_at = time.monotonic()
    kv_back = seconds_until(lambda: kv_at_baseline(cluster, "decode"), KV_LEASE_S)

    assert [s.error for s in streams] == [None] * num_requests
    assert [s.token_ids for s in streams] == expected
    assert kv_back is not None
    return {
        "requests": num_requests,
        "retried": sum(s.num_attempts >= 2 for s in streams),
        "failed": 0,
        "new_request_served_s": None if to_serve is None else round(to_serve, 2),
        "requests_done_after_kill_s": round(done_at - killed_at, 2),
        "decode_kv_back_after_requests_s": round(kv_back, 2),
    }


def test_kill_prefill_mid_prefill_loses_no_request(
    cluster: LocalCluster, client: GenerationClient, oracle: Oracle, record_property: pytest.RecordProperty
) -> None:
    figures = _kill_mid_prefill(cluster, client, oracle, num_requests=4, num_prompt_tokens=384)
    record_property("figures", figures)
    print(figures)
    assert figures["retried"] >= 1


@pytest.mark.soak
@pytest.mark.timeout(SOAK_TIMEOUT_S)
def test_kill_prefill_acceptance_prompts_of_1500_tokens(
    cluster: LocalCluster, client: GenerationClient, oracle: Oracle, record_property: pytest.RecordProperty
) -> None:
    while len(pods_of(cluster, "prefill")) < 2:
        cluster.add_pod("prefill")
    figures = _kill_mid_prefill(cluster, client, oracle, num_requests=4, num_prompt_tokens=1500)
    record_property("figures", figures)
    print(figures)
    assert figures["retried"] >= 1
