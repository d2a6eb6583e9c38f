"""One trace per request across router-, prefill- and decode-like services over real grpc.aio servers, exported
over OTLP/gRPC to a receiver the test runs; and tracing off is a true no-op."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from typing import Any, TypeAlias, cast

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2
from opentelemetry import trace

import common.telemetry as telemetry
from common.telemetry import Tracing, setup_tracing
from common.telemetry_config import TelemetryConfig
from pdserve.v1 import decode_pb2, decode_pb2_grpc, generation_pb2, generation_pb2_grpc
from tests.observability.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.observability.service_chain import (
    DECODE_TOKENS,
    FIRST_TOKEN,
    Chain,
    DecodeLike,
    health_check,
    serve,
    start_chain,
)

pytestmark = pytest.mark.anyio

CALLER_SPAN_ID = "b7ad6b7169203331"
TRACE_IDS = ("0af7651916cd43dd8448eb211c80319c", "4bf92f3577b34da6a3ce929d0e0e4736")
GENERATE = "pdserve.v1.GenerationService/Generate"
RESERVE = "pdserve.v1.DecodeService/Reserve"
PREFILL = "pdserve.v1.PrefillService/Prefill"
WAIT_S = 10.0

ROUTER_SERVER = ("pdserve-router", "SERVER", GENERATE)
EXPECTED_SHAPE = sorted(
    [
        (ROUTER_SERVER, ("caller", CALLER_SPAN_ID)),
        (("pdserve-router", "INTERNAL", "route"), ROUTER_SERVER),
        (("pdserve-router", "CLIENT", RESERVE), ROUTER_SERVER),
        (("pdserve-decode", "SERVER", RESERVE), ("pdserve-router", "CLIENT", RESERVE)),
        (("pdserve-router", "CLIENT", PREFILL), ROUTER_SERVER),
        (("pdserve-prefill", "SERVER", PREFILL), ("pdserve-router", "CLIENT", PREFILL)),
        (("pdserve-prefill", "INTERNAL", "engine.prefill"), ("pdserve-prefill", "SERVER", PREFILL)),
        (("pdserve-decode", "INTERNAL", "decode.batch"), ROUTER_SERVER),
    ]
)
"""(span, its parent) as (service, kind, name); the root's parent is the caller's remote span."""


def _traceparent(trace_id: str) -> tuple[tuple[str, str], ...]:
    return (("traceparent", f"00-{trace_id}-{CALLER_SPAN_ID}-01"),)


def _shape(spans: Sequence[ReceivedSpan]) -> list[tuple[tuple[Any, ...], tuple[Any, ...]]]:
    by_id = {span.span_id: span for span in spans}

    def key(span: ReceivedSpan) -> tuple[str, str, str]:
        return (span.service, span.kind, span.name)

    return sorted(
        (key(span), key(by_id[span.parent_id]) if span.parent_id in by_id else ("caller", span.parent_id))
        for span in spans
    )


def _one(spans: Sequence[ReceivedSpan], service: str, kind: str, name: str) -> ReceivedSpan:
    (span,) = [s for s in spans if (s.service, s.kind, s.name) == (service, kind, name)]
    return span


async def _generate(stub: generation_pb2_grpc.GenerationServiceAsyncStub, request_id: str, trace_id: str) -> list[int]:
    request = generation_pb2.GenerateRequest(text="hi", request_id=request_id)
    return [t async for response in stub.Generate(request, metadata=_traceparent(trace_id)) for t in response.token_ids]


async def _generate_and_cancel(stub: generation_pb2_grpc.GenerationServiceAsyncStub, chain: Chain) -> list[int]:
    """Request "hang": read the first token and the first decode token, then cancel and wait for the decode pod to
    see it."""
    call = stub.Generate(
        generation_pb2.GenerateRequest(text="hi", request_id="hang"), metadata=_traceparent(TRACE_IDS[0])
    )
    responses = [cast(generation_pb2.GenerateResponse, await call.read()) for _ in range(2)]
    call.cancel()
    await asyncio.wait_for(chain.decode.cancelled.wait(), WAIT_S)
    return [token_id for response in responses for token_id in response.token_ids]


Client: TypeAlias = "Callable[[generation_pb2_grpc.GenerationServiceAsyncStub, Chain], Awaitable[Any]]"


async def _run_chain(clients: Sequence[Client]) -> tuple[list[ReceivedSpan], list[Any]]:
    """Run the clients concurrently against the chain; returns the exported spans and each client's result (or its
    exception). A health check with a traceparent precedes them."""
    async with OtlpReceiver() as receiver:
        config = TelemetryConfig(otlp_endpoint=receiver.endpoint)
        tracings = [setup_tracing(config, role, environ={}) for role in ("router", "prefill", "decode")]
        async with AsyncExitStack() as stack:
            chain = await start_chain(stack, *tracings)
            async with grpc.aio.insecure_channel(chain.router_address) as channel:
                await health_check(channel)(health_pb2.HealthCheckRequest(), metadata=_traceparent(TRACE_IDS[0]))
                stub = generation_pb2_grpc.GenerationServiceStub(channel)
                results = await asyncio.gather(*(client(stub, chain) for client in clients), return_exceptions=True)
        for tracing in tracings:
            await tracing.aclose()
        return receiver.spans, results


def _requests(*requests: tuple[str, str]) -> list[Client]:
    """Clients that each run one (request_id, trace_id) Generate to its end and return its token ids."""
    return [functools.partial(_generate_request, request=request) for request in requests]


async def _generate_request(
    stub: generation_pb2_grpc.GenerationServiceAsyncStub, chain: Chain, request: tuple[str, str]
) -> list[int]:
    return await _generate(stub, *request)


async def test_one_trace_per_request_with_parent_links_across_three_services() -> None:
    spans, results = await _run_chain(_requests(("req-a", TRACE_IDS[0]), ("req-b", TRACE_IDS[1])))

    assert results == [[FIRST_TOKEN, *DECODE_TOKENS]] * 2
    assert {span.trace_id for span in spans} == set(TRACE_IDS)
    assert not [span for span in spans if "grpc.health" in span.name]
    for trace_id in TRACE_IDS:
        in_trace = [span for span in spans if span.trace_id == trace_id]
        assert _shape(in_trace) == EXPECTED_SHAPE
        assert {span.status for span in in_trace} == {"UNSET"}
        for span in in_trace:
            if span.kind in ("SERVER", "CLIENT"):
                service, method = span.name.split("/")
                assert span.attributes == {
                    "rpc.system": "grpc",
                    "rpc.service": service,
                    "rpc.method": method,
                    "rpc.grpc.status_code": 0,
                    **(
                        {"gen_ai.usage.output_tokens": 3, "gen_ai.response.finish_reasons": ["stop"]}
                        if span.name == GENERATE and span.kind == "SERVER"
                        else {}
                    ),
                }
        assert _one(in_trace, "pdserve-router", "INTERNAL", "route").attributes == {
            "gen_ai.operation.name": "text_completion",
            "gen_ai.request.model": "test-model",
            "gen_ai.request.max_tokens": 3,
            "pdserve.route.prefill_pod_id": "prefill-0",
        }
        assert _one(in_trace, "pdserve-decode", "SERVER", RESERVE).events == ("reserved",)
        assert _one(in_trace, "pdserve-prefill", "INTERNAL", "engine.prefill").events == ("pdserve.first_token",)


async def test_failed_call_ends_client_and_server_spans_with_its_status() -> None:
    spans, results = await _run_chain(_requests(("full", TRACE_IDS[0])))

    (error,) = results
    assert isinstance(error, grpc.aio.AioRpcError)
    assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    code = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert _shape(spans) == sorted(
        [
            (ROUTER_SERVER, ("caller", CALLER_SPAN_ID)),
            (("pdserve-router", "INTERNAL", "route"), ROUTER_SERVER),
            (("pdserve-router", "CLIENT", RESERVE), ROUTER_SERVER),
            (("pdserve-decode", "SERVER", RESERVE), ("pdserve-router", "CLIENT", RESERVE)),
        ]
    )
    summary = {(s.service, s.kind, s.name): (s.status, s.attributes.get("rpc.grpc.status_code")) for s in spans}
    assert summary == {
        ROUTER_SERVER: ("UNSET", code),
        ("pdserve-router", "INTERNAL", "route"): ("UNSET", None),
        ("pdserve-router", "CLIENT", RESERVE): ("ERROR", code),
        ("pdserve-decode", "SERVER", RESERVE): ("UNSET", code),
    }


async def test_cancelled_request_ends_every_span_with_cancelled() -> None:
    spans, results = await _run_chain([_generate_and_cancel])

    assert results == [[FIRST_TOKEN, DECODE_TOKENS[0]]]
    assert _shape(spans) == EXPECTED_SHAPE
    cancelled = grpc.StatusCode.CANCELLED.value[0]
    codes = {(s.service, s.kind, s.name): (s.status, s.attributes.get("rpc.grpc.status_code")) for s in spans}
    assert codes[ROUTER_SERVER] == ("UNSET", cancelled)
    assert codes[("pdserve-decode", "SERVER", RESERVE)] == ("UNSET", 0)


class _Forbidden:
    """Stands in for the SDK's provider, processor and exporters: tracing off must construct none of them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("tracing is off: nothing of the SDK may be created")


@pytest.mark.parametrize(
    "environ",
    [{}, {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}],
    ids=["no-endpoint", "sdk-disabled"],
)
async def test_tracing_off_is_a_true_no_op(monkeypatch: pytest.MonkeyPatch, environ: dict[str, str]) -> None:
    for name in ("TracerProvider", "BatchSpanProcessor", "GrpcSpanExporter", "HttpSpanExporter"):
        monkeypatch.setattr(telemetry, name, _Forbidden)
    tracing = setup_tracing(TelemetryConfig(), "router", environ=environ)

    assert not tracing.enabled
    assert type(tracing.tracer) is trace.NoOpTracer
    assert tracing.server_interceptors() == []
    assert tracing.client_interceptors() == []
    with tracing.span("route", {"pdserve.request.id": "r"}) as span:
        assert not span.is_recording()
    await tracing.aclose()


async def test_tracing_off_sends_no_trace_metadata_even_inside_a_valid_context() -> None:
    tracing = setup_tracing(TelemetryConfig(), "router", environ={})
    upstream = trace.NonRecordingSpan(
        trace.SpanContext(
            int(TRACE_IDS[0], 16), int(CALLER_SPAN_ID, 16), False, trace.TraceFlags(trace.TraceFlags.SAMPLED)
        )
    )
    servicer = DecodeLike(tracing)
    async with AsyncExitStack() as stack:
        address = await serve(
            stack,
            tracing,
            lambda s: decode_pb2_grpc.add_DecodeServiceServicer_to_server(servicer, s),
            "pdserve.v1.DecodeService",
        )
        async with grpc.aio.insecure_channel(address, interceptors=tracing.client_interceptors()) as channel:
            with trace.use_span(upstream):
                await decode_pb2_grpc.DecodeServiceStub(channel).Reserve(decode_pb2.ReserveRequest(request_id="r"))

    (keys,) = servicer.metadata_keys
    assert "traceparent" not in keys and "tracestate" not in keys


async def test_tracing_on_sends_the_current_context_in_metadata() -> None:
    async with OtlpReceiver() as receiver:
        tracing = setup_tracing(TelemetryConfig(otlp_endpoint=receiver.endpoint), "router", environ={})
        servicer = DecodeLike(Tracing(trace.NoOpTracer()))
        async with AsyncExitStack() as stack:
            address = await serve(
                stack,
                Tracing(trace.NoOpTracer()),
                lambda s: decode_pb2_grpc.add_DecodeServiceServicer_to_server(servicer, s),
                "pdserve.v1.DecodeService",
            )
            async with grpc.aio.insecure_channel(address, interceptors=tracing.client_interceptors()) as channel:
                await decode_pb2_grpc.DecodeServiceStub(channel).Reserve(
                    decode_pb2.ReserveRequest(request_id="r"), metadata=(("x-kept", "1"), ("traceparent", "stale"))
                )
        await tracing.aclose()

    (keys,) = servicer.metadata_keys
    assert keys.count("traceparent") == 1 and "x-kept" in keys
    (client_span,) = receiver.spans
    assert (client_span.kind, client_span.name, client_span.parent_id) == ("CLIENT", RESERVE, "")
