"""Tracing: one OpenTelemetry trace per request across the router, the prefill pod and the decode pod.

- `setup_tracing(config, role)` -> `Tracing`. Off (no OTLP endpoint, see common.telemetry_config): OpenTelemetry's
  non-recording tracer, no provider, processor, exporter or interceptor. On: a TracerProvider (service.name
  `pdserve-<role>`) exporting in batches over OTLP (gRPC or HTTP/protobuf).
- W3C trace context crosses gRPC in the call metadata (`traceparent`, `tracestate`): the server interceptor
  continues the caller's trace in a SERVER span that is current while the handler runs (unary and server-streaming
  handlers, async generators included); the client interceptors start a CLIENT span per outgoing unary-unary or
  unary-stream call, ended when the call's status arrives, and send its context. grpc.health.v1 and reflection
  calls are left alone (no span, no metadata).
- Across a thread hop (the engine thread): `ctx = capture_context()` on the asyncio side, `with attach(ctx):`
  (or `tracing.span(name, parent=ctx)`) on the other thread.
Attribute names follow the OpenTelemetry GenAI and RPC semantic conventions; pdserve's own are `pdserve.*`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

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

from common.telemetry_config import OtlpTarget, Role, TelemetryConfig, otlp_target

logger = logging.getLogger(__name__)

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

RPC_SYSTEM = "rpc.system"
RPC_SERVICE = "rpc.service"
RPC_METHOD = "rpc.method"
RPC_GRPC_STATUS_CODE = "rpc.grpc.status_code"

_UNTRACED_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
_TRACE_KEYS = ("traceparent", "tracestate")
# NOTE: the server-side codes that mean "the server failed" (OpenTelemetry RPC conventions); client spans treat
# every non-OK code as an error.
_SERVER_ERROR_CODES = frozenset(
    grpc.StatusCode[name]
    for name in ("UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS")
)
_PROPAGATOR = TraceContextTextMapPropagator()
_CLOSE_WAIT_S = 1.0

Attributes = Mapping[str, AttributeValue | None]
"""Span attributes; None values are left out (e.g. an unset temperature)."""


class Tracing:
    """A process's tracer and its gRPC interceptors; `enabled` is False for the non-recording no-op."""

    def __init__(self, tracer: trace.Tracer, provider: TracerProvider | None = None) -> None:
        self.tracer = tracer
        self._provider = provider
        self._client_spans = _ClientSpans(tracer) if provider is not None else None

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
        leaving the block is recorded on it and sets its status to ERROR."""
        return self.tracer.start_as_current_span(name, context=parent, kind=kind, attributes=_clean(attributes))

    def server_interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        """Put first in `grpc.aio.server(interceptors=[...])`, so the SERVER span sees the final status."""
        return [_ServerTracingInterceptor(self.tracer)] if self.enabled else []

    def client_interceptors(self) -> list[grpc.aio.ClientInterceptor]:
        """For `grpc.aio.insecure_channel(address, interceptors=...)`."""
        if self._client_spans is None:
            return []
        return [_UnaryUnaryTracing(self._client_spans), _UnaryStreamTracing(self._client_spans)]

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


def _untraced(method: str) -> bool:
    return method.startswith(_UNTRACED_PREFIXES)


def _rpc_attributes(method: str) -> dict[str, AttributeValue]:
    service, _, name = method.lstrip("/").partition("/")
    return {RPC_SYSTEM: "grpc", RPC_SERVICE: service, RPC_METHOD: name}


def _end(span: trace.Span, code: grpc.StatusCode, error_codes: frozenset[grpc.StatusCode] | None) -> None:
    """Status code attribute, ERROR status for `error_codes` (None: every non-OK code), end."""
    span.set_attribute(RPC_GRPC_STATUS_CODE, code.value[0])
    if code is not grpc.StatusCode.OK and (error_codes is None or code in error_codes):
        span.set_status(trace.Status(trace.StatusCode.ERROR, code.name))
    span.end()


_Behavior = Callable[..., Any]


class _ServerTracingInterceptor(grpc.aio.ServerInterceptor):
    """Continues the caller's trace in a SERVER span around each unary-request handler."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or handler.request_streaming or _untraced(method):
            return handler
        metadata = handler_call_details.invocation_metadata or ()
        parent = _PROPAGATOR.extract({key: value for key, value in metadata if key in _TRACE_KEYS})
        behavior = handler.unary_stream if handler.response_streaming else handler.unary_unary
        if inspect.isasyncgenfunction(behavior):
            wrapped = self._wrap_async_gen(behavior, method, parent)
        elif inspect.iscoroutinefunction(behavior):
            wrapped = self._wrap_coroutine(behavior, method, parent)
        else:
            return handler
        streaming = handler.response_streaming
        make = grpc.unary_stream_rpc_method_handler if streaming else grpc.unary_unary_rpc_method_handler
        return make(
            wrapped, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )

    @contextlib.contextmanager
    def _serving(
        self, method: str, parent: otel_context.Context, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Iterator[None]:
        span = self._tracer.start_span(
            method.lstrip("/"), context=parent, kind=trace.SpanKind.SERVER, attributes=_rpc_attributes(method)
        )
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        code: grpc.StatusCode | None = None
        try:
            yield
        except (asyncio.CancelledError, GeneratorExit):
            code = grpc.StatusCode.CANCELLED
            raise
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            span.record_exception(exc)
            code = grpc.StatusCode.UNKNOWN
            raise
        finally:
            otel_context.detach(token)
            _end(span, code or context.code() or grpc.StatusCode.OK, _SERVER_ERROR_CODES)

    def _wrap_coroutine(self, behavior: _Behavior, method: str, parent: otel_context.Context) -> _Behavior:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            with self._serving(method, parent, context):
                return await behavior(request, context)

        return wrapped

    def _wrap_async_gen(self, behavior: _Behavior, method: str, parent: otel_context.Context) -> _Behavior:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            with self._serving(method, parent, context):
                async with contextlib.aclosing(behavior(request, context)) as responses:
                    async for response in responses:
                        yield response

        return wrapped


class _ClientSpans:
    """A CLIENT span per outgoing call, its context sent in the metadata, ended when the status arrives."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer
        self._watchers: set[asyncio.Task[None]] = set()

    async def intercept(
        self, continuation: Callable[..., Any], details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        raw_method = details.method
        method = raw_method.decode() if isinstance(raw_method, bytes) else str(raw_method)
        if _untraced(method):
            return await continuation(details, request)
        span = self._tracer.start_span(
            method.lstrip("/"), kind=trace.SpanKind.CLIENT, attributes=_rpc_attributes(method)
        )
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        kept = [(key, value) for key, value in details.metadata or () if key not in _TRACE_KEYS]
        traced = grpc.aio.ClientCallDetails(
            details.method,
            details.timeout,
            grpc.aio.Metadata(*kept, *carrier.items()),
            details.credentials,
            details.wait_for_ready,
        )
        try:
            call = await continuation(traced, request)
        except BaseException as exc:
            span.record_exception(exc)
            _end(span, grpc.StatusCode.UNKNOWN, None)
            raise
        watcher = asyncio.create_task(self._end_when_done(call, span), name=f"trace {method}")
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        return call

    async def wait_idle(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) until every call's CLIENT span has ended."""
        if self._watchers:
            await asyncio.wait(set(self._watchers), timeout=timeout_s)

    @staticmethod
    async def _end_when_done(call: grpc.aio.Call, span: trace.Span) -> None:
        code = grpc.StatusCode.UNKNOWN
        try:
            code = await call.code()
        finally:
            _end(span, code, None)


# NOTE: a grpc.aio channel files each interceptor under the first call type it subclasses, so one interceptor
# object cannot serve both unary-unary and unary-stream calls.
class _UnaryUnaryTracing(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, spans: _ClientSpans) -> None:
        self._spans = spans

    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await self._spans.intercept(continuation, client_call_details, request)


class _UnaryStreamTracing(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, spans: _ClientSpans) -> None:
        self._spans = spans

    async def intercept_unary_stream(
        self, continuation: Callable[..., Any], client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await self._spans.intercept(continuation, client_call_details, request)
