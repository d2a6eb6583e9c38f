"""A tiny OTLP trace collector for tests: a grpc.aio TraceService server that keeps every exported span."""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc.aio
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2


@dataclass(slots=True, frozen=True)
class ReceivedSpan:
    """One exported span, ids in hex ("" for no parent)."""

    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    events: tuple[str, ...]
    status: str


def _value(value: common_pb2.AnyValue) -> Any:
    field = value.WhichOneof("value")
    if field == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, field) if field else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _received(service: str, span: trace_pb2.Span) -> ReceivedSpan:
    return ReceivedSpan(
        service=service,
        name=span.name,
        kind=trace_pb2.Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex(),
        attributes=_attributes(span.attributes),
        events=tuple(event.name for event in span.events),
        status=trace_pb2.Status.StatusCode.Name(span.status.code).removeprefix("STATUS_CODE_"),
    )


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """`async with OtlpReceiver() as receiver:` serves on `receiver.endpoint`; `receiver.spans` is what arrived."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.endpoint = ""
        self._server = grpc.aio.server()

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        for resource_spans in request.resource_spans:
            service = _attributes(resource_spans.resource.attributes)["service.name"]
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend(_received(service, span) for span in scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    async def __aenter__(self) -> OtlpReceiver:
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        self.endpoint = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._server.stop(None)
