"""SIGSTOP a decode pod for twice its KV lease, then SIGCONT (1 prefill + 2 decode pods, --kv-lease-s 3).

While it is stopped the router's keepalive pings go unanswered: its Decode calls fail with UNAVAILABLE within
seconds, the pod is suspect, and its completions migrate to the other decode pod. A long prompt whose blocks it had
reserved is still being prefilled and shipped to it; those chunks arrive after the lease lapsed and are refused
(the reservation ends EXPIRED, never claimed). Once continued, the pod rejoins and serves correct tokens, and no
KV stays held anywhere.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from cli.cluster import LocalCluster
from cli.service_process import ServiceProcess
from client.generation_client import GenerationClient
from tests.e2e.support import BLOCK_SIZE, Oracle, run
from tests.faults.support import (
    Stream,
    fault_cluster,
    join_streams,
    kv_at_baseline,
    pods_of,
    random_prompt,
    seconds_until,
    start_streams,
)

KV_LEASE_S = 3.0
NUM_TOKENS = 32
LONG_PROMPT_TOKENS = 512

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    log_dir = tmp_path_factory.mktemp("sigstop-logs")
    with fault_cluster(log_dir, num_prefill=1, num_decode=2, pod_args=("--kv-lease-s", str(KV_LEASE_S))) as local:
        yield local


def _free_blocks(cluster: LocalCluster) -> dict[str, int]:
    return {pod.pod_id: pod.num_free_blocks for pod in pods_of(cluster, "decode")}


def _reserving_pod(cluster: LocalCluster, before: dict[str, int]) -> str | None:
    """The decode pod whose free blocks fell by most of the long prompt's since `before`."""
    num_blocks = LONG_PROMPT_TOKENS // BLOCK_SIZE - 4
    dropped = [pod_id for pod_id, free in _free_blocks(cluster).items() if before[pod_id] - free >= num_blocks]
    return dropped[0] if len(dropped) == 1 else None


def _start_long_stream(cluster: LocalCluster, client: GenerationClient, long_prompt: list[int]) -> tuple[Stream, str]:
    """Start a greedy stream of `long_prompt`; it and the decode pod that reserved its blocks (polled for)."""
    before = _free_blocks(cluster)
    (long_stream,) = start_streams(client, [{"token_ids": long_prompt, "max_tokens": NUM_TOKENS, "temperature": 0.0}])
    assert seconds_until(lambda: _reserving_pod(cluster, before) is not None, 60.0) is not None
    victim = _reserving_pod(cluster, before)
    assert victim is not None
    return long_stream, victim


def _stop_for(process: ServiceProcess, seconds: float) -> float:
    """SIGSTOP `process` for `seconds`, then SIGCONT it; the time.monotonic() of the stop."""
    process.send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        time.sleep(seconds)
    finally:
        process.send_signal(signal.SIGCONT)
    return stopped_at


def _seconds_until_served_by(
    client: GenerationClient, request: Mapping[str, Any], expected: list[int], pod_id: str, timeout_s: float
) -> float | None:
    """Send `request` again and again (each answer must be `expected`) until `pod_id` decodes one: how long that
    took, None if it did not within `timeout_s`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        completion = run(client, **request)
        assert completion.token_ids == expected
        if completion.metrics.decode_pod_id == pod_id:
            return time.monotonic() - start
    return None


def test_sigstop_a_decode_pod_for_twice_its_lease(
    cluster: LocalCluster, oracle: Oracle, record_property: pytest.RecordProperty
) -> None:
    prompts = [random_prompt(200 + seed, 40) for seed in range(4)]
    long_prompt = random_prompt(300, LONG_PROMPT_TOKENS)
    (expected_long,) = [output.token_ids for output in oracle.greedy([long_prompt], NUM_TOKENS)]
    requests = [{"token_ids": p, "max_tokens": NUM_TOKENS, "temperature": 0.0, "ignore_eos": True} for p in prompts]
    with GenerationClient(cluster.router_address) as client:
        unfailed = start_streams(client, requests)
        join_streams(unfailed)
        expected = [s.token_ids for s in unfailed]
        assert [len(tokens) for tokens in expected] == [NUM_TOKENS] * len(prompts)
        streams = start_streams(client, requests)
        assert seconds_until(lambda: all(len(s.token_ids) >= 2 for s in streams), 120.0) is not None
        long_stream, victim = _start_long_stream(cluster, client, long_prompt)
        process = cluster.pods[victim]
        stopped_at = _stop_for(process, 2 * KV_LEASE_S)
        join_streams([*streams, long_stream])
        done_after_stop_s = time.monotonic() - stopped_at

        assert [s.error for s in [*streams, long_stream]] == [None] * 5
        assert [s.token_ids for s in [*streams, long_stream]] == [*expected, expected_long]
        migrated = sum(s.num_attempts >= 2 for s in [*streams, long_stream])
        # NOTE: the router spreads the 4 streams over both decode pods, so the stopped one held some mid-stream.
        assert sum(s.num_attempts >= 2 for s in streams) >= 1
        assert long_stream.num_attempts >= 2

        served_again_s = _seconds_until_served_by(client, requests[0], expected[0], victim, 60.0)
        assert served_again_s is not None, f"{victim} never served again after SIGCONT"
        # NOTE: the prefill pod too: it freed what it held for the transfer into the stopped pod.
        kv_back = seconds_until(lambda: kv_at_baseline(cluster), 2 * KV_LEASE_S)
        assert kv_back is not None
    # NOTE: the long prompt's reservation lapsed while the pod was stopped; its late chunks found it EXPIRED.
    log = process.log_path.read_text()
    assert "ended expired before its claim" in log
    figures = {
        "streams": 5,
        "migrated": migrated,
        "failed": 0,
        "done_after_sigstop_s": round(done_after_stop_s, 2),
        "victim_serves_again_after_s": round(served_again_s, 2),
        "kv_back_s": round(kv_back, 2),
    }
    record_property("figures", figures)
    print(figures)
