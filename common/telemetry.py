"""Tracing: one OpenTelemetry trace per request across the router, the prefill pod and the decode pod.

- `setup_tracing(config, role)` -> `Tracing`. Off (no OTLP endpoint, see common.telemetry_config): OpenTelemetry's
  non-recording tracer, no provider, processor, exporter or interceptor. On: a TracerProvider (service.name
  `pdserve-<role>`) exporting in batches over OTLP (gRPC or HTTP/protobuf).
- W3C trace context crosses gRPC in the call metadata: `Tracing.server_interceptors()` and
  `client_interceptors()` (common.grpc.tracing) continue and send it.
- Across a thread hop (the engine thread): `ctx = capture_context()` on the asyncio side, `with attach(ctx):`
  (or `tracing.span(name, parent=ctx)`) on the other thread.
Attribute names follow the OpenTelemetry GenAI semantic conventions (the RPC ones: common.grpc.tracing); pdserve's
own are `pdserve.*`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager

import grpc
import grpc.aio
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from common.grpc.tracing import ClientSpans, ServerTracingInterceptor, UnaryStreamTracing, UnaryUnaryTracing
from common.telemetry_config import OtlpTarget, Role, TelemetryConfig, otlp_target

logger = logging.getLogger(__name__)
_PROPAGATOR = TraceContextTextMapPropagator()

GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
"""A list of strings, one per choice (e.g. ["stop"])."""
GEN_AI_OPERATION_TEXT_COMPLETION = "text_completion"
GEN_AI_OPERATION_CHAT = "chat"

PDSERVE_REQUEST_ID = "pdserve.request.id"
PDSERVE_PREFILL_POD = "pdserve.route.prefill_pod_id"
PDSERVE_DECODE_POD = "pdserve.route.decode_pod_id"
PDSERVE_CACHED_PREFIX_TOKENS = "pdserve.route.cached_prefix_tokens"
PDSERVE_ROUTE_ATTEMPT = "pdserve.route.attempt"
PDSERVE_DIRECTORY_LATENCY_S = "pdserve.directory.latency_s"
PDSERVE_KV_TRANSFER_ID = "pdserve.kv_transfer.id"
PDSERVE_KV_TRANSFER_BACKEND = "pdserve.kv_transfer.backend"
PDSERVE_KV_TRANSFER_BYTES = "pdserve.kv_transfer.bytes"
PDSERVE_KV_TRANSFER_DURATION_S = "pdserve.kv_transfer.duration_s"

EVENT_FIRST_TOKEN = "pdserve.first_token"
EVENT_KV_TRANSFER_DONE = "pdserve.kv_transfer.done"
EVENT_DECODE_ADMITTED = "pdserve.decode.admitted"

_CLOSE_WAIT_S = 1.0

Attributes = Mapping[str, AttributeValue | None]
"""Span attributes; None values are left out (e.g. an unset temperature)."""


class Tracing:
    """A process's tracer and its gRPC interceptors; `enabled` is False for the non-recording no-op."""

    def __init__(self, tracer: trace.Tracer, provider: TracerProvider | None = None) -> None:
        self.tracer = tracer
        self._provider = provider
        self._client_spans = ClientSpans(tracer) if provider is not None else None

    @property
    def enabled(self) -> bool:
        return self._provider is not None

    def span(
        self,
        name: str,
        attributes: Attributes | None = None,
        *,
        parent: otel_context.Context | None = None,
        kind: trace.SpanKind = trace.SpanKind.INTERNAL,
    ) -> AbstractContextManager[trace.Span]:
        """A span, current inside the `with` block, child of the current span (or of `parent`'s); an exception
        leaving the block is recorded on it and sets its status to ERROR. With tracing off, a no-op span that costs
        no context switch (a request's path opens several)."""
        if self._provider is None:
            return contextlib.nullcontext(trace.INVALID_SPAN)
        return self.tracer.start_as_current_span(name, context=parent, kind=kind, attributes=_clean(attributes))

    def server_interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        """Put first in `grpc.aio.server(interceptors=[...])`, so the SERVER span sees the final status."""
        return [ServerTracingInterceptor(self.tracer)] if self.enabled else []

    def client_interceptors(self) -> list[grpc.aio.ClientInterceptor]:
        """For `grpc.aio.insecure_channel(address, interceptors=...)`."""
        if self._client_spans is None:
            return []
        return [UnaryUnaryTracing(self._client_spans), UnaryStreamTracing(self._client_spans)]

    async def aclose(self) -> None:
        """End the CLIENT spans of calls that are finishing (bounded wait), export the spans still queued and stop
        the exporter (on a worker thread: the export blocks). Close the process's channels first."""
        if self._client_spans is not None:
            await self._client_spans.wait_idle(_CLOSE_WAIT_S)
        if self._provider is not None:
            await asyncio.to_thread(self._provider.shutdown)


def setup_tracing(
    config: TelemetryConfig, role: Role, instance_id: str | None = None, environ: Mapping[str, str] | None = None
) -> Tracing:
    """The process's tracing (see the module docstring); `instance_id` (the pod id) becomes service.instance.id.
    `environ` defaults to os.environ."""
    target = otlp_target(config, environ)
    if target is None:
        return Tracing(trace.NoOpTracer())
    resource: dict[str, AttributeValue] = {SERVICE_NAME: config.resolved_service_name(role), "pdserve.role": role}
    if instance_id:
        resource[SERVICE_INSTANCE_ID] = instance_id
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(BatchSpanProcessor(_exporter(target)))
    logger.info("tracing: spans of %s go to %s over OTLP %s", resource[SERVICE_NAME], target.endpoint, target.protocol)
    return Tracing(provider.get_tracer("pdserve"), provider)


def context_carrier() -> dict[str, str]:
    """The current trace context as W3C headers (traceparent, tracestate), to send inside a message."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier


def context_from_carrier(carrier: Mapping[str, str]) -> otel_context.Context:
    """The trace context that `context_carrier` sent (an empty one when it carries none)."""
    return _PROPAGATOR.extract(dict(carrier))


def capture_context() -> otel_context.Context:
    """The current trace context, to hand to another thread (see `attach`)."""
    return otel_context.get_current()


@contextlib.contextmanager
def attach(ctx: otel_context.Context) -> Iterator[None]:
    """Make `ctx` (from `capture_context`) current inside the block, e.g. on the engine thread."""
    token = otel_context.attach(ctx)
    try:
        yield
    finally:
        otel_context.detach(token)


def add_event(name: str, attributes: Attributes | None = None) -> None:
    """An event (a timestamped log line) on the current span; nothing when no span records."""
    trace.get_current_span().add_event(name, _clean(attributes))


def set_attributes(attributes: Attributes) -> None:
    """Attributes on the current span; nothing when no span records."""
    trace.get_current_span().set_attributes(_clean(attributes))


def _clean(attributes: Attributes | None) -> dict[str, AttributeValue]:
    return {key: value for key, value in (attributes or {}).items() if value is not None}


def _exporter(target: OtlpTarget) -> SpanExporter:
    if target.protocol == "http/protobuf":
        return HttpSpanExporter(endpoint=target.endpoint)
    return GrpcSpanExporter(endpoint=target.endpoint)
