"""The services every pdserve gRPC server carries (grpc.health.v1 and server reflection), and its port: plain or
with TLS credentials (`add_port`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from common.tls import ChannelSecurity

_POLL_INTERVAL_S = 0.05
_MAX_POLL_INTERVAL_S = 0.5

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The gRPC message size limit of pdserve's servers and channels unless configured (gRPC's own default is 4 MiB)."""


def message_size_options(max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """Server or channel options that set the largest message received and sent to `max_bytes`.

    NOTE: set explicitly on both ends: a larger message is refused by gRPC itself with RESOURCE_EXHAUSTED, whose
    details name the limit ("... larger than max (<size> vs. <limit>)").
    """
    return [("grpc.max_receive_message_length", max_bytes), ("grpc.max_send_message_length", max_bytes)]


def reconnect_options(max_backoff_s: float, initial_backoff_s: float = 0.1) -> list[tuple[str, int]]:
    """Channel options that redial a lost server after `initial_backoff_s`, backing off to `max_backoff_s` at most.

    NOTE: gRPC's own backoff starts at 1 s and grows x1.6 up to 120 s, so a server that comes back (a restarted
    router, a pod that opened its port late) is seen seconds after it serves, the longer it was gone the later.
    """
    initial_ms = int(initial_backoff_s * 1000)
    return [
        ("grpc.initial_reconnect_backoff_ms", initial_ms),
        ("grpc.min_reconnect_backoff_ms", initial_ms),
        ("grpc.max_reconnect_backoff_ms", int(max_backoff_s * 1000)),
    ]


def pending_call_options(max_pending_calls: int) -> list[tuple[str, int]]:
    """Server options that let gRPC hold up to `max_pending_calls` calls that arrived before the server's event loop
    took them up, and cancel each call beyond.

    NOTE: grpc.aio takes up one arrived call per turn of its event loop; gRPC core holds the others, and from 1000 of
    them on (its default) cancels new ones at random, all of them from 3000 on: the client gets CANCELLED, a code it
    cannot tell from its own cancellation, with no RetryInfo, and the server never sees the call. A burst of a few
    thousand unary calls on one channel reaches that.
    """
    return [
        ("grpc.server.max_pending_requests", max_pending_calls),
        ("grpc.server.max_pending_requests_hard_limit", max_pending_calls),
    ]


class HealthState:
    """The health a server reports, for the whole server ("") and each of its services at once.

    Everything starts NOT_SERVING: a server says SERVING only once it has loaded, and NOT_SERVING
    again while it drains.
    """

    def __init__(self, servicer: health.aio.HealthServicer, service_names: Sequence[str]) -> None:
        self._servicer = servicer
        self._service_names = (health.OVERALL_HEALTH, *service_names)

    async def set_serving(self) -> None:
        """Reports SERVING for the server and each of its services."""
        await self._set(health_pb2.HealthCheckResponse.SERVING)

    async def set_not_serving(self) -> None:
        """Reports NOT_SERVING for the server and each of its services (loading or draining)."""
        await self._set(health_pb2.HealthCheckResponse.NOT_SERVING)

    async def _set(self, status: int) -> None:
        for name in self._service_names:
            await self._servicer.set(name, status)


def add_standard_services(server: grpc.aio.Server, service_full_names: Sequence[str]) -> HealthState:
    """Adds grpc.health.v1 and server reflection to `server`.

    `service_full_names` are the server's own services (e.g. "pdserve.v1.GenerationService");
    reflection lists them plus health and reflection, and health reports each of them. Call before
    `server.start()`; everything reports NOT_SERVING until `HealthState.set_serving()`.
    """
    names = (*service_full_names, health.SERVICE_NAME)
    servicer = health.aio.HealthServicer()
    # NOTE: the servicer's public setter is a coroutine and it starts with "" SERVING; before the server
    # starts no Watch can be waiting, so seeding its status table directly skips no notification.
    vars(servicer)["_server_status"].update(
        dict.fromkeys((health.OVERALL_HEALTH, *names), health_pb2.HealthCheckResponse.NOT_SERVING)
    )
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    reflection.enable_server_reflection((*names, reflection.SERVICE_NAME, REFLECTION_V1_SERVICE_NAME), server)
    _add_reflection_v1(server, names)
    return HealthState(servicer, names)


REFLECTION_V1_SERVICE_NAME = "grpc.reflection.v1.ServerReflection"


def _add_reflection_v1(server: grpc.aio.Server, names: Sequence[str]) -> None:
    """grpc.reflection.v1 beside v1alpha (newer grpcurl and tools ask for v1 first).

    NOTE: grpcio-reflection 1.85 ships v1alpha only; v1's messages are v1alpha's with the package renamed (same
    fields, same numbers), so the v1alpha servicer answers v1 calls byte for byte.
    """
    servicer = reflection.aio.ReflectionServicer((*names, reflection.SERVICE_NAME, REFLECTION_V1_SERVICE_NAME))
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(REFLECTION_V1_SERVICE_NAME, {"ServerReflectionInfo": handler}),)
    )


def add_port(server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None) -> int:
    """Bind `address` (host:port, port 0 picks one) in plain text, or with TLS when `credentials` are given; returns
    the bound port."""
    if credentials is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, credentials)


async def wait_for_health(address: str, timeout_s: float, security: ChannelSecurity | None = None) -> None:
    """Polls grpc.health.v1 Check on `address` until the server reports SERVING; dials with `security` (default:
    plain text).

    Raises TimeoutError naming the address (and the last answer) when it does not within `timeout_s`.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    interval = _POLL_INTERVAL_S
    last = "no answer"
    # NOTE: the channel redials as often as it polls: a server that opens its port late is seen as it serves.
    options = reconnect_options(_MAX_POLL_INTERVAL_S, _POLL_INTERVAL_S)
    async with (security or ChannelSecurity()).aio_channel(address, options=options) as channel:
        # NOTE: called by method path because the grpcio-health-checking stubs do not type HealthStub's methods.
        check = channel.unary_unary(
            f"/{health.SERVICE_NAME}/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        while (remaining := deadline - loop.time()) > 0:
            try:
                response = await check(health_pb2.HealthCheckRequest(), timeout=remaining)
            except grpc.aio.AioRpcError as exc:
                last = exc.code().name
            else:
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
            await asyncio.sleep(min(interval, max(deadline - loop.time(), 0.0)))
            interval = min(interval * 2, _MAX_POLL_INTERVAL_S)
    raise TimeoutError(f"{address} not SERVING after {timeout_s}s (last: {last})")
