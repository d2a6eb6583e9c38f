"""Overload on 1 prefill + 1 decode pod (real processes): every call completes or is refused RESOURCE_EXHAUSTED with a
RetryInfo at once, nothing hangs, a call past its deadline ends DEADLINE_EXCEEDED and frees its KV, and (soak) goodput
at 5x capacity stays at least 80% of goodput at capacity."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cli.client import build_request
from cli.cluster import LocalCluster
from pdserve.v1 import generation_pb2_grpc
from tests.faults.overload_support import (
    CLIENT_START_S,
    KV_BOUND_S,
    POD_ARGS,
    PROMPT,
    closed_loop,
    concurrent_streams,
)
from tests.faults.support import fault_cluster, kv_at_baseline, seconds_until

REFUSAL_BOUND_S = 0.1
"""From a call's send to its status (tests.faults.overload_support.concurrent_streams)."""
MAX_WAITING = 4
NUM_CLIENT_PROCESSES = 4
"""The 300-call burst's client processes (tests.faults.overload_support.concurrent_streams)."""


@pytest.fixture(scope="module")
def small_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The router admits at most MAX_WAITING calls waiting for their first token."""
    router_args = ("--max-waiting-requests-per-prefill-pod", str(MAX_WAITING))
    with fault_cluster(tmp_path_factory.mktemp("overload-logs"), pod_args=POD_ARGS, router_args=router_args) as cluster:
        yield cluster


@pytest.mark.slow
def test_calls_beyond_the_limits_are_refused_at_once_with_retry_info(small_cluster: LocalCluster) -> None:
    outcomes = concurrent_streams(small_cluster.router_address, 40, max_tokens=8)
    codes = Counter(o.code for o in outcomes)
    assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    assert codes[grpc.StatusCode.OK] >= MAX_WAITING
    assert all(o.num_tokens == 8 for o in outcomes if o.code is grpc.StatusCode.OK)
    refusals = [o for o in outcomes if o.code is grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert all(o.retry_delay_s is not None and 0.05 <= o.retry_delay_s <= 5.0 for o in refusals), refusals
    # NOTE: the bound is the median's: on the shared 2-core CI machine a few refusals wait for a busy event loop.
    slowest = sorted(o.duration_s for o in refusals)
    assert slowest[len(slowest) // 2] <= REFUSAL_BOUND_S, slowest
    assert seconds_until(lambda: kv_at_baseline(small_cluster), KV_BOUND_S) is not None, small_cluster.pod_infos()


@pytest.mark.slow
def test_a_call_past_its_deadline_is_deadline_exceeded_and_frees_its_kv(small_cluster: LocalCluster) -> None:
    assert seconds_until(lambda: kv_at_baseline(small_cluster), 10.0) is not None
    with grpc.insecure_channel(small_cluster.router_address) as channel:
        stub = generation_pb2_grpc.GenerationServiceStub(channel)
        # ~1,300 prompt tokens: 21 chunks of 64, far longer than the 1 s deadline on this CPU
        request = build_request(PROMPT * 60, max_tokens=64, ignore_eos=True, temperature=0.0)
        with pytest.raises(grpc.RpcError) as raised:
            for _ in stub.Generate(request, timeout=1.0):
                pass
        expired_at = time.monotonic()
    assert isinstance(raised.value, grpc.Call)
    assert raised.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    freed = seconds_until(lambda: kv_at_baseline(small_cluster), KV_BOUND_S)
    assert freed is not None, small_cluster.pod_infos()
    assert time.monotonic() - expired_at <= KV_BOUND_S + 0.5


@pytest.mark.soak
def test_goodput_at_5x_capacity_is_at_least_80_percent_of_capacity(tmp_path: Path) -> None:
    """The acceptance shape, with the default limits: capacity is the concurrency where goodput saturates (the
    fewest clients of 15, 30, 60 and 120 with 90% of the best goodput); then 5x as many clients."""
    with fault_cluster(tmp_path, pod_args=POD_ARGS) as cluster:
        closed_loop(cluster, 8, max_tokens=16, duration_s=5.0)  # warm-up
        sweep = {c: closed_loop(cluster, c, max_tokens=16, duration_s=20.0) for c in (15, 30, 60, 120)}
        best = max(r.goodput for r in sweep.values())
        capacity = min(c for c, r in sweep.items() if r.goodput >= 0.9 * best)
        overload = closed_loop(cluster, 5 * capacity, max_tokens=16, duration_s=20.0)
        refusals = [o for o in overload.outcomes if o.code is grpc.StatusCode.RESOURCE_EXHAUSTED]
        figures = {c: round(r.goodput, 1) for c, r in sweep.items()} | {5 * capacity: round(overload.goodput, 1)}
        per_cpu = {c: round(r.tokens_per_cpu_s, 1) for c, r in sweep.items()} | {
            5 * capacity: round(overload.tokens_per_cpu_s, 1)
        }
        codes = Counter(o.code.name for o in overload.outcomes)
        print(f"goodput (tokens/s) by clients: {figures}; per cluster CPU-second: {per_cpu}; outcomes at 5x: {codes}")
        if refusals:
            times = sorted(o.duration_s for o in refusals)
            print(f"refusal time p50 {times[len(times) // 2]:.3f} s, p99 {times[int(len(times) * 0.99)]:.3f} s")
        assert {o.code for o in overload.outcomes} <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert all(o.retry_delay_s is not None for o in refusals)
        assert overload.goodput >= 0.8 * sweep[capacity].goodput, figures
        assert seconds_until(lambda: kv_at_baseline(cluster), KV_BOUND_S) is not None, cluster.pod_infos()


@pytest.mark.soak
def test_300_concurrent_streams_complete_or_are_refused_within_100_ms(tmp_path: Path) -> None:
    """The acceptance shape with the default limits: 300 streams at once on 1P+1D; nothing hangs."""
    with fault_cluster(tmp_path, pod_args=POD_ARGS) as cluster:
        started = time.monotonic()
        outcomes = concurrent_streams(cluster.router_address, 300, max_tokens=16, num_processes=NUM_CLIENT_PROCESSES)
        wall_s = time.monotonic() - started - CLIENT_START_S
        codes = Counter(o.code.name for o in outcomes)
        refusals = sorted(o.duration_s for o in outcomes if o.code is grpc.StatusCode.RESOURCE_EXHAUSTED)
        done = sorted(o.duration_s for o in outcomes if o.code is grpc.StatusCode.OK)
        refusal_times = "none"
        if refusals:
            p50, p99 = (refusals[int(len(refusals) * q)] for q in (0.5, 0.99))
            refusal_times = f"{p50:.3f}/{p99:.3f}/{refusals[-1]:.3f} s"
        print(f"300 streams: {codes} in {wall_s:.1f} s; completed p50 {done[len(done) // 2]:.1f} s; refusals "
              f"p50/p99/max {refusal_times}")  # fmt: skip
        assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}
        assert all(o.num_tokens == 16 for o in outcomes if o.code is grpc.StatusCode.OK)
        assert all(t <= REFUSAL_BOUND_S for t in refusals), refusals[-5:]
        assert seconds_until(lambda: kv_at_baseline(cluster), KV_BOUND_S) is not None, cluster.pod_infos()
