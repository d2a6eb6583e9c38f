"""A server-streaming call cancelled by its client while the server writes: the tracing and error interceptors close
the handler in its own task, so no OpenTelemetry context fails to detach ("Failed to detach context")."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc.aio
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from common.grpc.errors import ErrorInterceptor
from common.grpc.tracing import ServerTracingInterceptor
from pdserve.v1 import generation_pb2, generation_pb2_grpc

NUM_CALLS = 10


class _Endless(generation_pb2_grpc.GenerationServiceServicer):
    """Streams large messages inside a span of its own until cancelled."""

    async def Generate(
        self, request: generation_pb2.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[generation_pb2.GenerateResponse]:
        with trace.get_tracer("handler").start_as_current_span("handler"):
            while True:
                yield generation_pb2.GenerateResponse(text="x" * 1000)
                await asyncio.sleep(0)


async def _cancel_calls(tracing: bool) -> None:
    tracer = TracerProvider().get_tracer("server")
    # NOTE: as a pdserve server stacks them; with tracing off the error interceptor is the only (outermost) one.
    interceptors = [ServerTracingInterceptor(tracer), ErrorInterceptor()] if tracing else [ErrorInterceptor()]
    server = grpc.aio.server(interceptors=interceptors)
    generation_pb2_grpc.add_GenerationServiceServicer_to_server(_Endless(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = generation_pb2_grpc.GenerationServiceStub(channel)
            for _ in range(NUM_CALLS):
                call = stub.Generate(generation_pb2.GenerateRequest())
                for _ in range(3):
                    await call.read()
                call.cancel()
            await asyncio.sleep(0.3)
    finally:
        await server.stop(None)


@pytest.mark.parametrize("tracing", [True, False])
def test_cancelled_streams_detach_every_context(tracing: bool, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="opentelemetry.context"):
        asyncio.run(_cancel_calls(tracing))
    assert [r.getMessage() for r in caplog.records if r.name == "opentelemetry.context"] == []
