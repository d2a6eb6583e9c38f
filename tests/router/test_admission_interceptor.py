"""The router's door (router.admission_interceptor) over a real gRPC server: a Generate call the router would refuse
ends at once with its status and RetryInfo, unparsed and unseen by the servicer; other calls pass."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest

from common.grpc_errors import ErrorInterceptor, retry_delay_s
from common.metrics import ServiceMetrics
from pdserve.v1 import generation_pb2, generation_pb2_grpc
from router.admission import DOOR_PASS, DRAIN_RETRY_S, RouterAdmission
from router.admission_interceptor import GENERATE_METHOD, AdmissionInterceptor
from router.config import RouterConfig
from router.door_burst import DoorBurst

MAX_RETRY_S = 2.0


class _Servicer(generation_pb2_grpc.GenerationServiceServicer):
    """Answers Generate with one response and Tokenize with one token; records each call it sees."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def Generate(self, request: generation_pb2.GenerateRequest, context: Any) -> AsyncIterator[Any]:
        self.calls.append("Generate")
        yield generation_pb2.GenerateResponse(request_id=request.request_id)

    async def Tokenize(self, request: generation_pb2.TokenizeRequest, context: Any) -> Any:
        self.calls.append("Tokenize")
        return generation_pb2.TokenizeResponse(token_ids=[1], num_tokens=1)


@contextlib.asynccontextmanager
async def _door(
    admission: RouterAdmission,
    metrics: ServiceMetrics,
    servicer: generation_pb2_grpc.GenerationServiceServicer,
    burst: DoorBurst | None = None,
) -> AsyncIterator[grpc.aio.Channel]:
    """A real gRPC server with the door (`burst`: its burst, else the default) and the error interceptor in front of
    `servicer`, and a channel to it."""
    server = grpc.aio.server(interceptors=[AdmissionInterceptor(admission, metrics, burst), ErrorInterceptor()])
    generation_pb2_grpc.add_GenerationServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel
    finally:
        await server.stop(None)


@pytest.mark.anyio
async def test_the_door_refuses_while_full_or_draining_and_lets_the_rest_through() -> None:
    draining = [False]
    config = RouterConfig(max_waiting_requests_per_prefill_pod=1, max_retry_s=MAX_RETRY_S)
    admission = RouterAdmission(config, lambda: 1, lambda: draining[0])
    metrics = ServiceMetrics("router")
    servicer = _Servicer()
    async with _door(admission, metrics, servicer) as channel:
        stub = generation_pb2_grpc.GenerationServiceStub(channel)
        garbage = channel.unary_stream(GENERATE_METHOD)  # raw bytes out and in
        tokenize = generation_pb2.TokenizeRequest(text="hi")

        assert [r.request_id async for r in stub.Generate(generation_pb2.GenerateRequest(request_id="a"))] == ["a"]
        ticket = admission.admission.admit("someone", 10, admission.limits())
        for call in (stub.Generate(generation_pb2.GenerateRequest(request_id="b")), garbage(b"\xff\xff")):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                [r async for r in call]
            assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert refused.value.details() == "overloaded: 1 requests waiting (limit 1)"
            assert retry_delay_s(refused.value) == MAX_RETRY_S
        assert (await stub.Tokenize(tokenize)).num_tokens == 1

        admission.admission.finish(ticket)
        draining[0] = True
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            [r async for r in stub.Generate(generation_pb2.GenerateRequest(request_id="c"))]
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        assert retry_delay_s(refused.value) == DRAIN_RETRY_S
        assert (await stub.Tokenize(tokenize)).num_tokens == 1
    assert servicer.calls == ["Generate", "Tokenize", "Tokenize"]
    rejections = {
        code: metrics.registry.get_sample_value("pdserve:router_rejections_total", {"role": "router", "code": code})
        for code in ("RESOURCE_EXHAUSTED", "UNAVAILABLE")
    }
    assert rejections == {"RESOURCE_EXHAUSTED": 2.0, "UNAVAILABLE": 1.0}


class _HoldingServicer(generation_pb2_grpc.GenerationServiceServicer):
    """Generate sends one response, records whether its call holds a door pass, then waits for `release`."""

    def __init__(self) -> None:
        self.held: list[bool] = []
        self.release = asyncio.Event()

    async def Generate(self, request: generation_pb2.GenerateRequest, context: Any) -> AsyncIterator[Any]:
        door_pass = DOOR_PASS.get()
        self.held.append(door_pass is not None and door_pass.held)
        yield generation_pb2.GenerateResponse(request_id=request.request_id)
        await self.release.wait()


@pytest.mark.anyio
async def test_a_call_let_in_holds_its_place_until_it_ends_however_it_ends() -> None:
    admission = RouterAdmission(
        RouterConfig(max_waiting_requests_per_prefill_pod=1, max_retry_s=MAX_RETRY_S), lambda: 1
    )
    servicer = _HoldingServicer()
    async with _door(admission, ServiceMetrics("router"), servicer) as channel:
        stub = generation_pb2_grpc.GenerationServiceStub(channel)
        first = stub.Generate(generation_pb2.GenerateRequest(request_id="a"))
        assert (await first.read()).request_id == "a"
        assert (servicer.held, admission.admission.num_held) == ([True], 1)
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # the queue is full of the first call's place
            [r async for r in stub.Generate(generation_pb2.GenerateRequest(request_id="b"))]
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        first.cancel()
        for _ in range(100):
            if admission.admission.num_held == 0:
                break
            await asyncio.sleep(0.01)
        assert admission.admission.num_held == 0
        unparsed = channel.unary_stream(GENERATE_METHOD)(b"\xff\xff")
        with pytest.raises(grpc.aio.AioRpcError) as invalid:
            [r async for r in unparsed]
        assert invalid.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        no_request = channel.stream_stream(GENERATE_METHOD)(iter([]))  # a raw client that sends no message
        with pytest.raises(grpc.aio.AioRpcError) as invalid:
            [r async for r in no_request]
        assert (invalid.value.code(), invalid.value.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "request: no request message was sent",
        )
        assert admission.admission.num_held == 0
        servicer.release.set()
        assert [r.request_id async for r in stub.Generate(generation_pb2.GenerateRequest(request_id="c"))] == ["c"]
        assert (servicer.held, admission.admission.num_held) == ([True, True], 0)


@pytest.mark.anyio
async def test_during_a_burst_the_door_answers_before_a_call_let_in_starts() -> None:
    admission = RouterAdmission(
        RouterConfig(max_waiting_requests_per_prefill_pod=1, max_retry_s=MAX_RETRY_S), lambda: 1
    )
    servicer = _Servicer()
    burst = DoorBurst(burst_calls=1, quiet_s=1.0, max_defer_s=5.0)  # every arrival is a burst, quiet after 1 s
    async with _door(admission, ServiceMetrics("router"), servicer, burst) as channel:
        stub = generation_pb2_grpc.GenerationServiceStub(channel)
        let_in = asyncio.ensure_future(_request_ids(stub.Generate(generation_pb2.GenerateRequest(request_id="a"))))
        await asyncio.sleep(0.1)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _request_ids(stub.Generate(generation_pb2.GenerateRequest(request_id="b")))
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (servicer.calls, let_in.done()) == ([], False)  # refused while the call let in waits out the burst
        assert await let_in == ["a"]
    assert servicer.calls == ["Generate"]


async def _request_ids(call: AsyncIterator[generation_pb2.GenerateResponse]) -> list[str]:
    return [response.request_id async for response in call]
