"""W3C trace context over gRPC: the tracing interceptors behind `Tracing` (common.telemetry).

The context crosses gRPC in the call metadata (`traceparent`, `tracestate`): the server interceptor continues the
caller's trace in a SERVER span that is current while the handler runs (unary and server-streaming handlers, async
generators included); the client interceptors start a CLIENT span per outgoing unary-unary or unary-stream call,
ended when the call's status arrives, and send its context. grpc.health.v1 and reflection calls are left alone (no
span, no metadata). Span attributes follow the OpenTelemetry RPC semantic conventions.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import grpc.aio
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from common.grpc.handlers import HandlerInterceptor, with_behavior

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


class ServerTracingInterceptor(HandlerInterceptor):
    """Continues the caller's trace in a SERVER span around each unary-request handler."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    def intercept_handler(
        self, handler: grpc.RpcMethodHandler[Any, Any], handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any]:
        method = handler_call_details.method
        if handler.request_streaming or _untraced(method):
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
        return with_behavior(handler, wrapped)

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
        """The async-generator handler as a coroutine that writes each response with context.write.

        NOTE: a cancelled call cancels its task; were this an async generator, the cancellation could land in gRPC's
        own frame while the handler sits at a `yield`, leaving the handler's generators to be closed later by the
        garbage collector's finalizer, in another context: every context attached inside them ("the gRPC SERVER
        span", "generate", ...) would then fail to detach ("Failed to detach context"). Awaiting each write here
        puts the cancellation in this frame, and aclosing closes the handler at once, in its own context.
        """

        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            with self._serving(method, parent, context):
                async with contextlib.aclosing(behavior(request, context)) as responses:
                    async for response in responses:
                        await context.write(response)

        return wrapped


class ClientSpans:
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
class UnaryUnaryTracing(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, spans: ClientSpans) -> None:
        self._spans = spans

    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await self._spans.intercept(continuation, client_call_details, request)


class UnaryStreamTracing(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, spans: ClientSpans) -> None:
        self._spans = spans

    async def intercept_unary_stream(
        self, continuation: Callable[..., Any], client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await self._spans.intercept(continuation, client_call_details, request)
