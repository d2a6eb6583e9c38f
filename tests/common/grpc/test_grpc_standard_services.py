"""Health and reflection over a real grpc.aio server on a local port."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf.descriptor_pb2 import FileDescriptorProto
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from common.grpc.server import HealthState, wait_for_health
from tests.common.grpc.grpc_server_support import SERVICE, run_served


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

    run_served(test)


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

    run_served(test)
