"""Observability over real processes: a small cluster (1 prefill, 1 decode, the router) with tracing ON, sending
its spans to an in-test OTLP/gRPC receiver, and /metrics on free ports; the shared cluster has tracing OFF.

(a) one trace per request, spans from all three services linked router SERVER -> "generate" -> CLIENT ->
pod SERVER -> pod internal spans, the GenAI attributes on "generate", no spans for health checks; (b) each
service's /metrics moves by the expected amounts over N requests sharing a long prefix; (c) tracing off creates
no exporter and costs no latency; (d) every metric the Grafana dashboard queries is served.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli.cluster import LocalCluster
from client.generation_client import GenerationClient
from common.grpc.server import wait_for_health
from common.telemetry import (
    GEN_AI_OPERATION_NAME,
    GEN_AI_REQUEST_MAX_TOKENS,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_REQUEST_TEMPERATURE,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    PDSERVE_REQUEST_ID,
)
from tests.e2e.support import MIN_CACHED, PREFIX_TOKENS, cluster_config, run, sequential, token_prefix, wait_until
from tests.observability.otlp_receiver import OtlpReceiver, ReceivedSpan

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "pdserve-dashboard.json"
METRIC_NAME = re.compile(r"\bpdserve:[a-zA-Z0-9_:]+")
SERVICES = {"router": "pdserve-router", "prefill": "pdserve-prefill", "decode": "pdserve-decode"}
GENERATE = "pdserve.v1.GenerationService/Generate"
RESERVE, PREFILL, DECODE = (
    f"pdserve.v1.{m}" for m in ("DecodeService/Reserve", "PrefillService/Prefill", "DecodeService/DecodeStream")
)
TRACING_ON_LOG = "tracing: spans of"
"""What common.telemetry.setup_tracing logs when it creates an exporter."""
NUM_REPEATS = 4
NUM_LATENCY_RUNS = 10
LATENCY_RATIO_BOUND = 1.5
SPAN_WAIT_S = 10.0


class ThreadedReceiver:
    """An OtlpReceiver served by an event loop on its own thread, so that blocking tests can read its spans."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="otlp-receiver", daemon=True)
        self._receiver: OtlpReceiver | None = None

    @property
    def endpoint(self) -> str:
        assert self._receiver is not None
        return self._receiver.endpoint

    @property
    def spans(self) -> list[ReceivedSpan]:
        assert self._receiver is not None
        return list(self._receiver.spans)

    def __enter__(self) -> ThreadedReceiver:
        self._thread.start()

        async def start() -> OtlpReceiver:
            # NOTE: made on the loop's thread: a grpc.aio server belongs to the loop it was made on.
            return await OtlpReceiver().__aenter__()

        self._receiver = asyncio.run_coroutine_threadsafe(start(), self._loop).result(10.0)
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._receiver is not None
        asyncio.run_coroutine_threadsafe(self._receiver.__aexit__(None, None, None), self._loop).result(10.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10.0)
        self._loop.close()


@pytest.fixture(scope="module")
def receiver() -> Iterator[ThreadedReceiver]:
    with ThreadedReceiver() as running:
        yield running


@pytest.fixture(scope="module")
def traced(receiver: ThreadedReceiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """1 prefill + 1 decode + the router, tracing to `receiver` (exported every 100 ms), /metrics on free ports."""
    config = cluster_config(
        tmp_path_factory.mktemp("traced-cluster-logs"),
        metrics_port=0,
        otlp_endpoint=receiver.endpoint,
        env={"OTEL_BSP_SCHEDULE_DELAY": "100"},
    )
    with LocalCluster(config) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def traced_client(traced: LocalCluster) -> Iterator[GenerationClient]:
    with GenerationClient(traced.router_address) as generation_client:
        yield generation_client


def scrape(url: str) -> dict[str, float]:
    """Every sample of a /metrics page, summed over labels, by sample name (e.g. pdserve:prompt_tokens_total)."""
    with urllib.request.urlopen(url, timeout=5.0) as response:
        text = response.read().decode()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
    return samples


def served_names(url: str) -> set[str]:
    """The names PromQL can select on a /metrics page: counters as `<name>_total`, histograms with their
    `_bucket`/`_sum`/`_count` series, whether or not a labelled family has samples yet."""
    with urllib.request.urlopen(url, timeout=5.0) as response:
        text = response.read().decode()
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names |= {family.name, *(family.name + suffix for suffix in ("_bucket", "_sum", "_count"))}
        else:
            names.add(family.name)
    return names


def trace_of(receiver: ThreadedReceiver, request_id: str) -> list[ReceivedSpan]:
    """Every span of the trace whose "generate" span carries `request_id` ([] until it arrived)."""
    spans = receiver.spans
    roots = [s for s in spans if s.name == "generate" and s.attributes.get(PDSERVE_REQUEST_ID) == request_id]
    if not roots:
        return []
    return [s for s in spans if s.trace_id == roots[0].trace_id]


def one(spans: list[ReceivedSpan], service: str, name: str, kind: str) -> ReceivedSpan:
    found = [s for s in spans if s.service == SERVICES[service] and s.name == name and s.kind == kind]
    assert len(found) == 1, (service, name, kind, [(s.service, s.name, s.kind) for s in spans])
    return found[0]


def under(span: ReceivedSpan, ancestor: ReceivedSpan, by_id: dict[str, ReceivedSpan]) -> bool:
    """`ancestor` is on `span`'s parent chain."""
    while span.parent_id:
        if span.parent_id == ancestor.span_id:
            return True
        if span.parent_id not in by_id:
            return False
        span = by_id[span.parent_id]
    return False


def test_one_trace_per_request_spans_all_three_services_with_links_and_genai_attributes(
    traced: LocalCluster, traced_client: GenerationClient, receiver: ThreadedReceiver
) -> None:
    asyncio.run(wait_for_health(traced.router_address, 5.0))
    completion = run(
        traced_client,
        prompt="The capital of France is",
        max_tokens=4,
        temperature=0.0,
        ignore_eos=True,
        request_id="trace-me",
    )

    def complete() -> bool:
        services = {s.service for s in trace_of(receiver, "trace-me")}
        names = {s.name for s in trace_of(receiver, "trace-me")}
        return (
            services == set(SERVICES.values()) and {GENERATE, RESERVE, PREFILL, "prefill", "decode.generate"} <= names
        )

    assert wait_until(complete, SPAN_WAIT_S), [(s.service, s.name) for s in trace_of(receiver, "trace-me")]
    time.sleep(0.5)  # NOTE: the pods' last spans (transfer end, decode) may come one export later.
    spans = trace_of(receiver, "trace-me")
    by_id = {s.span_id: s for s in spans}
    server = one(spans, "router", GENERATE, "SERVER")
    generate = one(spans, "router", "generate", "INTERNAL")
    assert server.parent_id == ""
    assert generate.parent_id == server.span_id
    for name in ("tokenize", "route"):
        assert one(spans, "router", name, "INTERNAL").parent_id == generate.span_id
    for role, method in (("decode", RESERVE), ("prefill", PREFILL)):
        client_span = one(spans, "router", method, "CLIENT")
        assert client_span.parent_id == generate.span_id
        assert one(spans, role, method, "SERVER").parent_id == client_span.span_id
    prefill_inside = [s for s in spans if s.service == SERVICES["prefill"] and s.kind == "INTERNAL"]
    assert "prefill" in {s.name for s in prefill_inside}, [s.name for s in prefill_inside]
    assert all(s.parent_id in by_id for s in prefill_inside), [(s.name, s.parent_id) for s in prefill_inside]
    assert under(
        next(s for s in prefill_inside if s.name == "prefill"), one(spans, "prefill", PREFILL, "SERVER"), by_id
    )
    # NOTE: the DecodeStream is shared by the router's requests: each DecodeStart carries its request's trace context,
    # and the decode pod's spans of the request continue the router's "generate" span.
    assert not [s for s in spans if s.name == DECODE]
    for name in ("decode.admission", "decode.generate"):
        assert one(spans, "decode", name, "INTERNAL").parent_id == generate.span_id
    assert {
        key: generate.attributes.get(key)
        for key in (
            GEN_AI_OPERATION_NAME,
            GEN_AI_REQUEST_MODEL,
            GEN_AI_REQUEST_MAX_TOKENS,
            GEN_AI_REQUEST_TEMPERATURE,
            GEN_AI_USAGE_INPUT_TOKENS,
            GEN_AI_USAGE_OUTPUT_TOKENS,
            GEN_AI_RESPONSE_FINISH_REASONS,
        )
    } == {
        GEN_AI_OPERATION_NAME: "text_completion",
        GEN_AI_REQUEST_MODEL: "smollm2-135m",
        GEN_AI_REQUEST_MAX_TOKENS: 4,
        GEN_AI_REQUEST_TEMPERATURE: 0.0,
        GEN_AI_USAGE_INPUT_TOKENS: completion.usage.prompt_tokens,
        GEN_AI_USAGE_OUTPUT_TOKENS: 4,
        GEN_AI_RESPONSE_FINISH_REASONS: ["length"],
    }
    assert all(s.trace_id == server.trace_id for s in spans)
    assert [s.name for s in receiver.spans if "grpc.health" in s.name or "Health" in s.name] == []


def test_metrics_move_by_the_expected_amounts_over_n_requests(
    traced: LocalCluster, traced_client: GenerationClient
) -> None:
    urls = traced.metrics_urls
    before = {name: scrape(url) for name, url in urls.items()}
    completions = sequential(traced_client, token_prefix(seed=50), NUM_REPEATS)
    num_prompt_tokens = PREFIX_TOKENS + 3
    kv_bytes = sum(c.metrics.kv_transfer_bytes for c in completions)
    assert kv_bytes > 0
    assert all(c.usage.cached_prompt_tokens >= MIN_CACHED for c in completions[1:])
    expected = {
        ("router", "pdserve:request_success_total"): NUM_REPEATS,
        ("router", "pdserve:time_to_first_token_seconds_count"): NUM_REPEATS,
        ("router", "pdserve:e2e_request_latency_seconds_count"): NUM_REPEATS,
        ("router", "pdserve:prompt_tokens_total"): NUM_REPEATS * num_prompt_tokens,
        ("router", "pdserve:generation_tokens_total"): 2 * NUM_REPEATS,
        # NOTE: one prefill pod: the router has no choice to make and asks the directory nothing.
        ("router", "pdserve:directory_lookups_total"): 0,
        ("prefill-0", "pdserve:kv_transfer_bytes_total"): kv_bytes,
        ("decode-0", "pdserve:generation_tokens_total"): NUM_REPEATS,
    }
    at_least = {
        ("prefill-0", "pdserve:prompt_tokens_total"): 1,
        ("prefill-0", "pdserve:prefix_cache_hits_total"): (NUM_REPEATS - 1) * MIN_CACHED,
    }
    moved: dict[tuple[str, str], float] = {}

    def settled() -> bool:
        after = {name: scrape(url) for name, url in urls.items()}
        moved.clear()
        for service, sample in [*expected, *at_least]:
            moved[service, sample] = after[service].get(sample, 0.0) - before[service].get(sample, 0.0)
        return all(moved[key] == value for key, value in expected.items()) and all(
            moved[key] >= value for key, value in at_least.items()
        )

    # NOTE: the pods update some counters after a step's outputs left; a few scrapes let them settle.
    settled_in_time = wait_until(settled, 5.0, interval_s=0.2)
    assert {key: moved[key] for key in expected} == expected
    assert {key: moved[key] >= value for key, value in at_least.items()} == dict.fromkeys(at_least, True), moved
    assert settled_in_time


def test_every_metric_the_dashboard_queries_is_served(traced: LocalCluster) -> None:
    served = set().union(*(served_names(url) for url in traced.metrics_urls.values()))
    queried = set(METRIC_NAME.findall(DASHBOARD.read_text()))
    assert queried, "the dashboard queries no pdserve: metric"
    assert queried - served == set()


def test_tracing_off_creates_no_exporter_and_costs_no_latency(
    cluster: LocalCluster, client: GenerationClient, traced: LocalCluster, traced_client: GenerationClient
) -> None:
    for process_log in traced.log_dir.glob("*.log"):
        assert TRACING_ON_LOG in process_log.read_text(errors="replace"), process_log.name
    run(client, prompt="Warm up", max_tokens=2, temperature=0.0)
    for process_log in cluster.log_dir.glob("*.log"):
        assert TRACING_ON_LOG not in process_log.read_text(errors="replace"), process_log.name
    assert "tracing off: no OTLP endpoint" in (cluster.log_dir / "router.log").read_text(errors="replace")
    prompt = "The three primary colors are"
    request: dict[str, Any] = {"prompt": prompt, "max_tokens": 2, "temperature": 0.0, "ignore_eos": True}
    latencies: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(NUM_LATENCY_RUNS + 1):
        for label, which in (("on", traced_client), ("off", client)):
            started = time.perf_counter()
            run(which, **request)
            latencies[label].append(time.perf_counter() - started)
    on, off = (statistics.median(latencies[label][1:]) for label in ("on", "off"))
    print(
        f"\nmedian end-to-end latency over {NUM_LATENCY_RUNS} requests: tracing on {on * 1e3:.1f} ms, "
        f"off {off * 1e3:.1f} ms, ratio {on / off:.2f}"
    )
    assert on / off < LATENCY_RATIO_BOUND, (on, off)
