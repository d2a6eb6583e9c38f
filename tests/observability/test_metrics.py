"""ServiceMetrics: each method moves exactly the expected series by exactly the expected amounts; /metrics over HTTP."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from common.metrics import (
    FAST_LOOKUP_BUCKETS,
    KV_TRANSFER_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TOKEN_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    ServiceMetrics,
    forget_process,
    multiprocess_registry,
)

Series = tuple[str, tuple[tuple[str, str], ...]]
"""(sample name, sorted labels)."""


def _samples(registry: CollectorRegistry) -> dict[Series, float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in registry.collect()
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def _moved(metrics: ServiceMetrics, action: Callable[[], None]) -> dict[Series, float]:
    """The series `action` changed, with how much (new series count from 0)."""
    before = _samples(metrics.registry)
    action()
    after = _samples(metrics.registry)
    return {key: value - before.get(key, 0.0) for key, value in after.items() if value != before.get(key, 0.0)}


def _labels(role: str, **extra: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"role": role, **extra}.items()))


def _counted(name: str, amount: float, role: str, **extra: str) -> dict[Series, float]:
    return {(f"pdserve:{name}_total", _labels(role, **extra)): amount}


def _set(name: str, amount: float, role: str) -> dict[Series, float]:
    return {(f"pdserve:{name}", _labels(role)): amount}


def _observed(name: str, value: float, buckets: Sequence[float], role: str, **extra: str) -> dict[Series, float]:
    """One observation of `value`: count +1, sum +value, +1 in every bucket whose bound is >= value."""
    base = f"pdserve:{name}"
    moved = {(f"{base}_count", _labels(role, **extra)): 1.0, (f"{base}_sum", _labels(role, **extra)): value}
    for bound in (*buckets, math.inf):
        if value <= bound:
            le = "+Inf" if bound == math.inf else repr(float(bound))
            moved[(f"{base}_bucket", _labels(role, le=le, **extra))] = 1.0
    return moved


def _merge(*parts: dict[Series, float]) -> dict[Series, float]:
    merged: dict[Series, float] = {}
    for part in parts:
        merged.update(part)
    return merged


@pytest.fixture
def router() -> Iterator[ServiceMetrics]:
    metrics = ServiceMetrics("router")
    yield metrics
    metrics.close()


def test_first_token_counts_ttft_prompt_and_one_generated_token(router: ServiceMetrics) -> None:
    assert _moved(router, lambda: router.observe_first_token(0.25, 7)) == _merge(
        _observed("time_to_first_token_seconds", 0.25, TTFT_BUCKETS, "router"),
        _counted("prompt_tokens", 7, "router"),
        _counted("generation_tokens", 1, "router"),
    )


def test_output_tokens_count_and_observe_inter_token_latency_when_given() -> None:
    decode = ServiceMetrics("decode")
    assert _moved(decode, lambda: decode.observe_output_tokens(3, 0.125)) == _merge(
        _counted("generation_tokens", 3, "decode"),
        _observed("inter_token_latency_seconds", 0.125, TOKEN_LATENCY_BUCKETS, "decode"),
    )
    assert _moved(decode, lambda: decode.observe_output_tokens(2)) == _counted("generation_tokens", 2, "decode")


def test_finished_observes_the_phases_given_and_time_per_output_token() -> None:
    decode = ServiceMetrics("decode")
    assert _moved(decode, lambda: decode.observe_finished("length", 6.0, 5, decode_s=2.0)) == _merge(
        _counted("request_success", 1, "decode", finished_reason="length"),
        _observed("e2e_request_latency_seconds", 6.0, REQUEST_LATENCY_BUCKETS, "decode"),
        _observed("request_decode_time_seconds", 2.0, REQUEST_LATENCY_BUCKETS, "decode"),
        _observed("request_time_per_output_token_seconds", 0.5, TOKEN_LATENCY_BUCKETS, "decode"),
    )
    prefill = ServiceMetrics("prefill")
    finish = lambda: prefill.observe_finished("stop", 1.5, 1, queue_s=0.5, prefill_s=1.0)  # noqa: E731
    assert _moved(prefill, finish) == _merge(
        _counted("request_success", 1, "prefill", finished_reason="stop"),
        _observed("e2e_request_latency_seconds", 1.5, REQUEST_LATENCY_BUCKETS, "prefill"),
        _observed("request_queue_time_seconds", 0.5, REQUEST_LATENCY_BUCKETS, "prefill"),
        _observed("request_prefill_time_seconds", 1.0, REQUEST_LATENCY_BUCKETS, "prefill"),
    )
    one_token = lambda: prefill.observe_finished("stop", 0.5, 1, decode_s=0.25)  # noqa: E731
    assert _moved(prefill, one_token) == _merge(
        _counted("request_success", 1, "prefill", finished_reason="stop"),
        _observed("e2e_request_latency_seconds", 0.5, REQUEST_LATENCY_BUCKETS, "prefill"),
        _observed("request_decode_time_seconds", 0.25, REQUEST_LATENCY_BUCKETS, "prefill"),
    )


def test_engine_state_sets_gauges_and_advances_counters_by_the_change_of_the_totals() -> None:
    pod = ServiceMetrics("prefill")

    def state(
        running: int, waiting: int, usage: float, queries: int, hits: int, preemptions: int
    ) -> Callable[[], None]:
        return lambda: pod.set_engine_state(
            num_running=running,
            num_waiting=waiting,
            kv_cache_usage=usage,
            prefix_cache_queries=queries,
            prefix_cache_hits=hits,
            num_preemptions=preemptions,
        )

    assert _moved(pod, state(3, 2, 0.25, 100, 40, 1)) == _merge(
        _set("num_requests_running", 3, "prefill"),
        _set("num_requests_waiting", 2, "prefill"),
        _set("kv_cache_usage_perc", 0.25, "prefill"),
        _counted("prefix_cache_queries", 100, "prefill"),
        _counted("prefix_cache_hits", 40, "prefill"),
        _counted("num_preemptions", 1, "prefill", mode="recompute"),
    )
    assert _moved(pod, state(3, 0, 0.25, 150, 40, 3)) == _merge(
        _set("num_requests_waiting", -2, "prefill"),
        _counted("prefix_cache_queries", 50, "prefill"),
        _counted("num_preemptions", 2, "prefill", mode="recompute"),
    )
    # A total that went down (a new engine) started over from 0.
    assert _moved(pod, state(3, 0, 0.25, 10, 5, 3)) == _merge(
        _counted("prefix_cache_queries", 10, "prefill"),
        _counted("prefix_cache_hits", 5, "prefill"),
    )
    assert pod.registry.get_sample_value("pdserve:prefix_cache_queries_total", {"role": "prefill"}) == 160


def test_preemptions_count_by_mode() -> None:
    pod = ServiceMetrics("decode")

    def state(preemptions: int, swapped: int) -> Callable[[], None]:
        return lambda: pod.set_engine_state(
            num_running=1,
            num_waiting=0,
            kv_cache_usage=0.5,
            prefix_cache_queries=0,
            prefix_cache_hits=0,
            num_preemptions=preemptions,
            num_swap_preemptions=swapped,
        )

    assert _moved(pod, state(3, 2)) == _merge(
        _set("num_requests_running", 1, "decode"),
        _set("kv_cache_usage_perc", 0.5, "decode"),
        _counted("num_preemptions", 1, "decode", mode="recompute"),
        _counted("num_preemptions", 2, "decode", mode="swap"),
    )
    assert _moved(pod, state(7, 2)) == _counted("num_preemptions", 4, "decode", mode="recompute")
    assert _moved(pod, state(8, 3)) == _counted("num_preemptions", 1, "decode", mode="swap")


def _host_blocks(role: str, swapped: float, cached: float, free: float) -> dict[Series, float]:
    return {
        ("pdserve:host_kv_cache_blocks", _labels(role, state=state)): amount
        for state, amount in (("swapped", swapped), ("cached", cached), ("free", free))
        if amount
    }


def test_host_tier_counters_advance_by_the_change_and_its_gauges_count_slots() -> None:
    pod = ServiceMetrics("prefill")

    def tier(out: int, back: int, hits: int, swapped: int, cached: int) -> Callable[[], None]:
        return lambda: pod.set_host_tier(
            num_blocks_swapped_out=out,
            num_blocks_swapped_in=back,
            host_prefix_cache_hits=hits,
            num_slots=40,
            num_swapped_slots=swapped,
            num_cached_slots=cached,
        )

    assert _moved(pod, tier(6, 0, 0, 6, 4)) == _merge(
        _counted("kv_swapped_out_blocks", 6, "prefill"),
        _set("cpu_cache_usage_perc", 0.25, "prefill"),
        _host_blocks("prefill", swapped=6, cached=4, free=30),
    )
    assert _moved(pod, tier(6, 5, 48, 0, 10)) == _merge(
        _counted("kv_swapped_in_blocks", 5, "prefill"),
        _counted("host_prefix_cache_hits", 48, "prefill"),
        _host_blocks("prefill", swapped=-6, cached=6, free=0),
    )
    assert pod.registry.get_sample_value("pdserve:cpu_cache_usage_perc", {"role": "prefill"}) == 0.25
    assert pod.registry.get_sample_value("pdserve:host_kv_cache_blocks", {"role": "prefill", "state": "free"}) == 30
    # A new engine's totals start over from 0.
    assert _moved(pod, tier(2, 2, 16, 0, 10)) == _merge(
        _counted("kv_swapped_out_blocks", 2, "prefill"),
        _counted("kv_swapped_in_blocks", 2, "prefill"),
        _counted("host_prefix_cache_hits", 16, "prefill"),
    )


def test_kv_transfer_series_carry_the_backend() -> None:
    pod = ServiceMetrics("prefill")
    assert _moved(pod, lambda: pod.observe_kv_transfer("tcp", 4096, 0.0625)) == _merge(
        _observed("kv_transfer_duration_seconds", 0.0625, KV_TRANSFER_BUCKETS, "prefill", backend="tcp"),
        _counted("kv_transfer_bytes", 4096, "prefill", backend="tcp"),
    )
    assert _moved(pod, lambda: pod.count_kv_transfer_failure("in_process")) == _counted(
        "kv_transfer_failures", 1, "prefill", backend="in_process"
    )
    assert _moved(pod, pod.count_kv_lease_expiry) == _counted("kv_lease_expiries", 1, "prefill")


def test_directory_lookups_hits_errors_and_latency(router: ServiceMetrics) -> None:
    assert _moved(router, lambda: router.observe_directory_lookup(0.001, hit=True)) == _merge(
        _counted("directory_lookups", 1, "router"),
        _counted("directory_hits", 1, "router"),
        _observed("directory_lookup_latency_seconds", 0.001, FAST_LOOKUP_BUCKETS, "router"),
    )
    assert _moved(router, lambda: router.observe_directory_lookup(0.5, hit=False)) == _merge(
        _counted("directory_lookups", 1, "router"),
        _observed("directory_lookup_latency_seconds", 0.5, FAST_LOOKUP_BUCKETS, "router"),
    )
    assert _moved(router, router.count_directory_error) == _merge(
        _counted("directory_lookups", 1, "router"), _counted("directory_errors", 1, "router")
    )


def test_router_retries_rejections_and_tokenizer_queue_time(router: ServiceMetrics) -> None:
    assert _moved(router, router.count_router_retry) == _counted("router_retries", 1, "router")
    assert _moved(router, lambda: router.count_router_rejection("RESOURCE_EXHAUSTED")) == _counted(
        "router_rejections", 1, "router", code="RESOURCE_EXHAUSTED"
    )
    assert _moved(router, lambda: router.observe_tokenizer_queue_time(0.0025)) == _observed(
        "tokenizer_pool_queue_time_seconds", 0.0025, FAST_LOOKUP_BUCKETS, "router"
    )


def test_registries_are_per_instance(router: ServiceMetrics) -> None:
    other = ServiceMetrics("router")
    assert _moved(other, lambda: router.observe_first_token(0.25, 7)) == {}
    assert other.registry.get_sample_value("pdserve:prompt_tokens_total", {"role": "router"}) == 0


def test_metrics_are_served_over_http_on_a_free_port(router: ServiceMetrics) -> None:
    assert router.start_http_server(None) is None
    router.count_router_rejection("UNAVAILABLE")
    port = router.start_http_server(0, "127.0.0.1")
    assert port is not None and port > 0
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
        lines = response.read().decode().splitlines()
    assert 'pdserve:router_rejections_total{code="UNAVAILABLE",role="router"} 1.0' in lines
    assert 'pdserve:num_requests_running{role="router"} 0.0' in lines
    router.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)


_WRITER = """
import sys
from common.metrics import ServiceMetrics
metrics = ServiceMetrics("router")
for _ in range(int(sys.argv[1])):
    metrics.count_router_rejection("RESOURCE_EXHAUSTED")
    metrics.observe_first_token(0.05, 10)
metrics.set_engine_state(num_running=int(sys.argv[1]), num_waiting=0, kv_cache_usage=0.0, prefix_cache_queries=0,
                         prefix_cache_hits=0, num_preemptions=0)
print(__import__("os").getpid(), flush=True)
"""


def test_processes_in_multiprocess_mode_sum_and_an_exited_one_keeps_its_counts(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    writers = [[sys.executable, "-c", _WRITER, str(count)] for count in (2, 3)]
    pids = [int(subprocess.run(argv, env=env, capture_output=True, timeout=60, check=True).stdout) for argv in writers]
    role = (("role", "router"),)
    rejected = ("pdserve:router_rejections_total", (("code", "RESOURCE_EXHAUSTED"), ("role", "router")))
    running = ("pdserve:num_requests_running", role)
    registry = multiprocess_registry(tmp_path)
    samples = _samples(registry)
    assert (samples[rejected], samples[("pdserve:time_to_first_token_seconds_count", role)]) == (5.0, 5.0)
    assert (samples[("pdserve:prompt_tokens_total", role)], samples[running]) == (50.0, 5.0)
    forget_process(pids[1], tmp_path)
    samples = _samples(registry)
    assert (samples[rejected], samples[running]) == (5.0, 2.0)
