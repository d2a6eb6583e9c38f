"""A real grpc.aio server on a local port for the common gRPC tests: a GenerationService servicer that raises what a
test asks for, behind the ErrorInterceptor, with the standard services (health, reflection)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import grpc.aio

from common.errors import InvalidArgumentError, ResourceExhaustedError, UnavailableError
from common.grpc.errors import ErrorInterceptor
from common.grpc.server import HealthState, add_standard_services
from common.sampling_params import SamplingParams
from pdserve.v1 import generation_pb2, generation_pb2_grpc

SERVICE = "pdserve.v1.GenerationService"
Context = grpc.aio.ServicerContext[Any, Any]


class ErrorRaisingServicer(generation_pb2_grpc.GenerationServiceServicer):
    """Raises what the test needs; Tokenize's prompt text names the error to raise."""

    def __init__(self, address: list[str]) -> None:
        self._address = address

    async def Generate(
        self, request: generation_pb2.GenerateRequest, context: Context
    ) -> AsyncIterator[generation_pb2.GenerateResponse]:
        yield generation_pb2.GenerateResponse(request_id=request.request_id, text="first")
        SamplingParams(temperature=request.sampling_params.temperature)
        yield generation_pb2.GenerateResponse(request_id=request.request_id, text="second")

    async def GetModelInfo(
        self, request: generation_pb2.GetModelInfoRequest, context: Context
    ) -> generation_pb2.GetModelInfoResponse:
        raise ResourceExhaustedError("no free KV blocks")

    async def Tokenize(
        self, request: generation_pb2.TokenizeRequest, context: Context
    ) -> generation_pb2.TokenizeResponse:
        if request.text == "prompt":
            raise InvalidArgumentError("prompt", "too long")
        if request.text == "unavailable":
            raise UnavailableError("no decode pod")
        if request.text == "overloaded":
            raise ResourceExhaustedError("overloaded: 3 requests waiting", retry_after_s=0.2504)
        if request.text == "unplaceable":
            raise UnavailableError("no pair left", retry_after_s=1.5)
        if request.text == "abort":
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
        if request.text == "downstream":
            async with grpc.aio.insecure_channel(self._address[0]) as channel:
                await generation_pb2_grpc.GenerationServiceStub(channel).GetModelInfo(
                    generation_pb2.GetModelInfoRequest()
                )
        raise RuntimeError("boom")


@asynccontextmanager
async def serving() -> AsyncIterator[tuple[generation_pb2_grpc.GenerationServiceAsyncStub, str, HealthState]]:
    """A grpc.aio server on a free local port: ErrorRaisingServicer behind the ErrorInterceptor, with health and
    reflection; yields a stub on it, its address and its health state."""
    server = grpc.aio.server(interceptors=[ErrorInterceptor()])
    address: list[str] = []
    generation_pb2_grpc.add_GenerationServiceServicer_to_server(ErrorRaisingServicer(address), server)
    health = add_standard_services(server, [SERVICE])
    address.append(f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(address[0]) as channel:
            yield generation_pb2_grpc.GenerationServiceStub(channel), address[0], health
    finally:
        await server.stop(None)


def run_served(
    test: Callable[[generation_pb2_grpc.GenerationServiceAsyncStub, str, HealthState], Awaitable[None]],
) -> None:
    """Run `test(stub, address, health)` against a fresh server (bounded to 10 s)."""

    async def main() -> None:
        async with serving() as (stub, address, health):
            await asyncio.wait_for(test(stub, address, health), timeout=10)

    asyncio.run(main())
