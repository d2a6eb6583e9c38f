"""Tracing and metrics of a prefill + decode pod pair: one trace per request across both pods with the right
parents, metrics that move by exact amounts, and nothing of the tracing SDK when tracing is off."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli.ports import free_port
from cli.redis_server import RedisServer
from common import telemetry
from common.telemetry import setup_tracing
from common.telemetry_config import TelemetryConfig
from pdserve.v1 import sampling_pb2
from tests.decode_service.pod_pair import running_pods
from tests.observability.otlp_receiver import OtlpReceiver, ReceivedSpan

pytestmark = pytest.mark.anyio

MAX_TOKENS = 5
PARAMS = sampling_pb2.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
PROMPT = [(11 * i + 5) % 512 for i in range(40)]  # 3 chunks of 16, 16 and 8 tokens (threshold 16)
OTHER_PROMPT = [(13 * i + 7) % 512 for i in range(20)]
PREFILL = "pdserve.v1.PrefillService/Prefill"


def _one(spans: list[ReceivedSpan], service: str, name: str) -> ReceivedSpan:
    found = [s for s in spans if s.service == service and s.name == name]
    assert len(found) == 1, (service, name, found)
    return found[0]


async def test_one_trace_across_both_pods(tiny_model: Path, redis_server: RedisServer) -> None:
    async with OtlpReceiver() as receiver:
        client = setup_tracing(TelemetryConfig(otlp_endpoint=receiver.endpoint), "router", environ={})
        flags = ["--otlp-endpoint", receiver.endpoint]
        pods_cm = running_pods(tiny_model, redis_server.url, flags, flags, interceptors=client.client_interceptors())
        async with pods_cm as pods:
            with client.span("client"):
                flow = await pods.generate(PROMPT, PARAMS)
        await client.aclose()
        spans = receiver.spans
    root = _one(spans, "pdserve-router", "client")
    assert {s.trace_id for s in spans} == {root.trace_id}
    prefill_server = _one(spans, "pdserve-prefill", PREFILL)
    assert prefill_server.parent_id == _one(spans, "pdserve-router", PREFILL).span_id
    assert _one(spans, "pdserve-router", PREFILL).parent_id == root.span_id
    prefill = _one(spans, "pdserve-prefill", "prefill")
    assert prefill.parent_id == prefill_server.span_id
    assert prefill.events == (telemetry.EVENT_FIRST_TOKEN,)
    chunks = sorted(
        (s for s in spans if s.name == "prefill.chunk"), key=lambda s: s.attributes["pdserve.prefill.chunk.start_token"]
    )
    assert [(c.parent_id, c.attributes["pdserve.prefill.chunk.num_tokens"]) for c in chunks] == [
        (prefill.span_id, 16),
        (prefill.span_id, 16),
        (prefill.span_id, 8),
    ]
    transfer = _one(spans, "pdserve-prefill", "kv_transfer")
    assert transfer.parent_id == prefill_server.span_id
    block_nbytes = flow.reserve.kv_target.layout.block_nbytes
    assert transfer.attributes[telemetry.PDSERVE_KV_TRANSFER_BACKEND] == "tcp"
    assert transfer.attributes[telemetry.PDSERVE_KV_TRANSFER_BYTES] == 3 * block_nbytes
    assert transfer.events == (telemetry.EVENT_KV_TRANSFER_DONE,)
    # NOTE: the DecodeStream is shared by many requests: its DecodeStart carries each request's trace context.
    assert not [s for s in spans if s.name.endswith("DecodeStream")]
    admission = _one(spans, "pdserve-decode", "decode.admission")
    generate = _one(spans, "pdserve-decode", "decode.generate")
    assert (admission.parent_id, generate.parent_id) == (root.span_id, root.span_id)
    assert admission.events == (telemetry.EVENT_DECODE_ADMITTED,)
    assert generate.events == ("first_decode_token",)
    assert generate.attributes[telemetry.GEN_AI_USAGE_OUTPUT_TOKENS] == MAX_TOKENS
    assert _one(spans, "pdserve-decode", "pdserve.v1.DecodeService/Reserve").parent_id != ""
    assert not [s for s in spans if "Health" in s.name]


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_metrics_move_by_exact_amounts(tiny_model: Path, redis_server: RedisServer) -> None:
    prefill_port, decode_port = free_port(), free_port()
    prefill_flags = ["--metrics-port", str(prefill_port), "--metrics-host", "127.0.0.1"]
    decode_flags = ["--metrics-port", str(decode_port), "--metrics-host", "127.0.0.1"]
    async with running_pods(tiny_model, redis_server.url, prefill_flags, decode_flags) as pods:
        flows = [await pods.generate(prompt, PARAMS) for prompt in (PROMPT, PROMPT, OTHER_PROMPT)]
        assert [f.prefill[0].first_token.num_cached_tokens for f in flows] == [0, 32, 0]
        prefill, decode = _scrape(prefill_port), _scrape(decode_port)
    block_nbytes = flows[0].reserve.kv_target.layout.block_nbytes
    p, d = (("role", "prefill"),), (("role", "decode"),)
    assert prefill[("pdserve:prompt_tokens_total", p)] == 100
    assert prefill[("pdserve:generation_tokens_total", p)] == 3
    assert prefill[("pdserve:prefix_cache_hits_total", p)] == 32
    assert prefill[("pdserve:time_to_first_token_seconds_count", p)] == 3
    assert prefill[("pdserve:kv_transfer_bytes_total", (("backend", "tcp"), *p))] == (3 + 3 + 2) * block_nbytes
    assert prefill[("pdserve:kv_transfer_duration_seconds_count", (("backend", "tcp"), *p))] == 3
    assert prefill[("pdserve:request_success_total", (("finished_reason", "length"), *p))] == 3
    assert prefill[("pdserve:request_queue_time_seconds_count", p)] == 3
    assert decode[("pdserve:generation_tokens_total", d)] == 3 * (MAX_TOKENS - 1)
    assert decode[("pdserve:inter_token_latency_seconds_count", d)] == 3 * (MAX_TOKENS - 2)
    assert decode[("pdserve:request_success_total", (("finished_reason", "length"), *d))] == 3
    assert decode[("pdserve:request_decode_time_seconds_count", d)] == 3
    assert decode[("pdserve:num_requests_running", d)] == 0


class _Forbidden:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("tracing is off: nothing of the SDK may be created")


async def test_tracing_off_creates_no_exporter(
    tiny_model: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    for name in ("TracerProvider", "BatchSpanProcessor", "GrpcSpanExporter", "HttpSpanExporter"):
        monkeypatch.setattr(telemetry, name, _Forbidden)
    async with running_pods(tiny_model, redis_server.url) as pods:
        flows = await asyncio.gather(pods.generate(PROMPT, PARAMS), pods.generate(OTHER_PROMPT, PARAMS))
    assert [len(f.token_ids) for f in flows] == [MAX_TOKENS, MAX_TOKENS]
