"""Errors, health and reflection over a real grpc.aio server on a local port."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf.descriptor_pb2 import FileDescriptorProto
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from common.errors import InvalidArgumentError, PdserveError, ResourceExhaustedError, UnavailableError
from common.grpc_errors import ErrorInterceptor, bad_request_fields, retry_delay_s, to_status
from common.grpc_server import HealthState, add_standard_services, wait_for_health
from common.sampling_params import SamplingParams
from kv_transfer.state import LayoutMismatchError, TransferExpiredError, UnknownTransferError
from pdserve.v1 import generation_pb2, generation_pb2_grpc

SERVICE = "pdserve.v1.GenerationService"
Context = grpc.aio.ServicerContext[Any, Any]


class _Servicer(generation_pb2_grpc.GenerationServiceServicer):
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
async def _serving() -> AsyncIterator[tuple[generation_pb2_grpc.GenerationServiceAsyncStub, str, HealthState]]:
    server = grpc.aio.server(interceptors=[ErrorInterceptor()])
    address: list[str] = []
    generation_pb2_grpc.add_GenerationServiceServicer_to_server(_Servicer(address), server)
    health = add_standard_services(server, [SERVICE])
    address.append(f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(address[0]) as channel:
            yield generation_pb2_grpc.GenerationServiceStub(channel), address[0], health
    finally:
        await server.stop(None)


def _run(test: Callable[[generation_pb2_grpc.GenerationServiceAsyncStub, str, HealthState], Awaitable[None]]) -> None:
    async def main() -> None:
        async with _serving() as (stub, address, health):
            await asyncio.wait_for(test(stub, address, health), timeout=10)

    asyncio.run(main())


def _rich_status(error: grpc.aio.AioRpcError) -> status_pb2.Status:
    (value,) = [v for k, v in error.trailing_metadata() or () if k == "grpc-status-details-bin"]
    assert isinstance(value, bytes)
    return status_pb2.Status.FromString(value)


def test_invalid_argument_names_the_public_field_after_streamed_messages() -> None:
    async def test(stub: Any, address: str, health: HealthState) -> None:
        request = generation_pb2.GenerateRequest(request_id="r1")
        request.sampling_params.temperature = -1.0
        call = stub.Generate(request)
        assert (await call.read()).text == "first"
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call.read()
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert raised.value.details() == "sampling_params.temperature: must be finite and >= 0, got -1.0"
        violation = ("sampling_params.temperature", "must be finite and >= 0, got -1.0")
        assert bad_request_fields(raised.value) == [violation]

    _run(test)


def test_engine_prompt_maps_to_text() -> None:
    async def test(stub: Any, address: str, health: HealthState) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.Tokenize(generation_pb2.TokenizeRequest(text="prompt"))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bad_request_fields(raised.value) == [("text", "too long")]

    _run(test)


def test_resource_exhausted_carries_retry_info() -> None:
    async def test(stub: Any, address: str, health: HealthState) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.GetModelInfo(generation_pb2.GetModelInfoRequest())
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert raised.value.details() == "no free KV blocks"
        (detail,) = _rich_status(raised.value).details
        retry_info = error_details_pb2.RetryInfo()
        assert detail.Unpack(retry_info)
        assert retry_info.retry_delay.ToNanoseconds() == 1_000_000_000
        assert bad_request_fields(raised.value) == []

    _run(test)


def test_an_errors_own_retry_after_is_its_retry_info_in_milliseconds() -> None:
    async def test(stub: Any, address: str, health: HealthState) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as overloaded:
            await stub.Tokenize(generation_pb2.TokenizeRequest(text="overloaded"))
        assert (overloaded.value.code(), overloaded.value.details()) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "overloaded: 3 requests waiting",
        )
        assert retry_delay_s(overloaded.value) == 0.25
        with pytest.raises(grpc.aio.AioRpcError) as unplaceable:
            await stub.Tokenize(generation_pb2.TokenizeRequest(text="unplaceable"))
        assert unplaceable.value.code() == grpc.StatusCode.UNAVAILABLE
        assert retry_delay_s(unplaceable.value) == 1.5
        with pytest.raises(grpc.aio.AioRpcError) as plain:
            await stub.Tokenize(generation_pb2.TokenizeRequest(text="unavailable"))
        assert retry_delay_s(plain.value) is None

    _run(test)


def test_unavailable_abort_and_downstream_status() -> None:
    async def test(stub: Any, address: str, health: HealthState) -> None:
        outcomes = []
        for text in ("unavailable", "abort", "downstream"):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await stub.Tokenize(generation_pb2.TokenizeRequest(text=text))
            outcomes.append((raised.value.code(), raised.value.details()))
        assert outcomes == [
            (grpc.StatusCode.UNAVAILABLE, "no decode pod"),
            (grpc.StatusCode.NOT_FOUND, "no such thing"),
            (grpc.StatusCode.RESOURCE_EXHAUSTED, "no free KV blocks"),
        ]

    _run(test)


def test_unexpected_error_is_internal_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def test(stub: Any, address: str, health: HealthState) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.Tokenize(generation_pb2.TokenizeRequest(text="other"))
        assert (raised.value.code(), raised.value.details()) == (grpc.StatusCode.INTERNAL, "internal error")

    with caplog.at_level(logging.ERROR, logger="common.grpc_errors"):
        _run(test)
    (record,) = caplog.records
    assert record.getMessage() == "unhandled RuntimeError in a gRPC handler"
    assert record.exc_info is not None
    assert str(record.exc_info[1]) == "boom"


def test_pdserve_errors_report_the_status_their_class_names() -> None:
    cases = [
        (TransferExpiredError("KV transfer 't' ended expired").for_request("r"), grpc.StatusCode.ABORTED),
        (LayoutMismatchError("KV layouts differ in dtype"), grpc.StatusCode.FAILED_PRECONDITION),
        (UnknownTransferError("no transfer 'u'"), grpc.StatusCode.NOT_FOUND),
    ]
    for error, code in cases:
        assert (to_status(error).code, to_status(error).details) == (code, str(error))
    assert str(cases[0][0]) == "request 'r': KV transfer 't' ended expired"
    assert type(cases[0][0]) is TransferExpiredError
    # NOTE: a plain PdserveError names no status of its own: INTERNAL, its message kept out of the reply.
    assert (to_status(PdserveError("secret")).code, to_status(PdserveError("secret")).details) == (
        grpc.StatusCode.INTERNAL,
        "internal error",
    )


def test_to_status_keeps_unknown_and_dotted_fields() -> None:
    for field in ("cache_salt", "sampling_params.top_p"):
        status = to_status(InvalidArgumentError(field, "bad"))
        assert (status.code, status.details) == (grpc.StatusCode.INVALID_ARGUMENT, f"{field}: bad")
    status = to_status(InvalidArgumentError("stop", "bad"), field_paths={})
    assert status.details == "stop: bad"
    assert to_status(UnavailableError()).details == "no healthy pod"
    rich = status_pb2.Status.FromString(
        dict(to_status(ResourceExhaustedError(), retry_delay_s=0.25).trailing_metadata)["grpc-status-details-bin"]
    )
    retry_info = error_details_pb2.RetryInfo()
    assert rich.code == code_pb2.RESOURCE_EXHAUSTED
    assert rich.details[0].Unpack(retry_info)
    assert retry_info.retry_delay.ToNanoseconds() == 250_000_000


def test_unavailable_carries_retry_info_only_when_it_names_a_delay() -> None:
    bare = status_pb2.Status.FromString(
        dict(to_status(UnavailableError("no pod", retry_after_s=0.75)).trailing_metadata)["grpc-status-details-bin"]
    )
    retry_info = error_details_pb2.RetryInfo()
    assert (bare.code, bare.message) == (code_pb2.UNAVAILABLE, "no pod")
    assert bare.details[0].Unpack(retry_info)
    assert retry_info.retry_delay.ToNanoseconds() == 750_000_000
    plain = status_pb2.Status.FromString(
        dict(to_status(UnavailableError("no pod")).trailing_metadata)["grpc-status-details-bin"]
    )
    assert (plain.code, plain.message, len(plain.details)) == (code_pb2.UNAVAILABLE, "no pod", 0)


def test_retry_delay_is_read_back_from_a_call_error() -> None:
    async def test(stub: Any, address: str, health: HealthState) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as exhausted:
            await stub.GetModelInfo(generation_pb2.GetModelInfoRequest())
        with pytest.raises(grpc.aio.AioRpcError) as unavailable:
            await stub.Tokenize(generation_pb2.TokenizeRequest(text="unavailable"))
        assert (retry_delay_s(exhausted.value), retry_delay_s(unavailable.value)) == (1.0, None)

    _run(test)


def test_health_starts_not_serving_and_follows_the_state() -> None:
    async def test(stub: Any, address: str, health: HealthState) -> None:
        check = _health_check(address)
        services = ["", SERVICE, "grpc.health.v1.Health"]
        not_serving = [health_pb2.HealthCheckResponse.NOT_SERVING] * 3
        assert [await check(name) for name in services] == not_serving
        with pytest.raises(TimeoutError) as raised:
            await wait_for_health(address, timeout_s=0.2)
        assert str(raised.value) == f"{address} not SERVING after 0.2s (last: NOT_SERVING)"
        await health.set_serving()
        await wait_for_health(address, timeout_s=1.0)
        assert [await check(name) for name in services] == [health_pb2.HealthCheckResponse.SERVING] * 3
        await health.set_not_serving()
        assert [await check(name) for name in services] == not_serving

    _run(test)


def _health_check(address: str) -> Callable[[str], Awaitable[int]]:
    """Health Check of one service on `address`, over a channel of its own."""

    async def check(service: str) -> int:
        async with grpc.aio.insecure_channel(address) as channel:
            call = channel.unary_unary(
                "/grpc.health.v1.Health/Check",
                request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                response_deserializer=health_pb2.HealthCheckResponse.FromString,
            )
            response: health_pb2.HealthCheckResponse = await call(health_pb2.HealthCheckRequest(service=service))
            return response.status

    return check


def test_wait_for_health_times_out_without_a_server() -> None:
    async def main() -> None:
        with pytest.raises(TimeoutError) as raised:
            await wait_for_health("127.0.0.1:1", timeout_s=0.1)
        assert str(raised.value) == "127.0.0.1:1 not SERVING after 0.1s (last: UNAVAILABLE)"

    asyncio.run(main())


@pytest.mark.parametrize("version", ["v1alpha", "v1"])
def test_reflection_lists_the_services(version: str) -> None:
    async def test(stub: Any, address: str, health: HealthState) -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            # NOTE: v1 and v1alpha messages are the same bytes (grpcio-reflection ships v1alpha's classes only).
            info = channel.stream_stream(
                f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
                request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
            )
            requests = [
                reflection_pb2.ServerReflectionRequest(list_services=""),
                reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE),
            ]
            listed, file = [response async for response in info(iter(requests))]
        assert sorted(s.name for s in listed.list_services_response.service) == [
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
            SERVICE,
        ]
        files = [FileDescriptorProto.FromString(f) for f in file.file_descriptor_response.file_descriptor_proto]
        assert [f.name for f in files] == [
            "pdserve/v1/generation.proto",
            "google/protobuf/duration.proto",
            "pdserve/v1/sampling.proto",
        ]
        assert [s.name for s in files[0].service] == ["GenerationService"]

    _run(test)
