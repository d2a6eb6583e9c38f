"""`pdserve health`: one grpc.health.v1 Check of a server, for container healthchecks and Kubernetes probes.

Light on purpose: gRPC and the health protos only (no torch, no model code), and one call, no retries.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2

from common.auth import bearer_metadata
from common.tls import ChannelSecurity

DEFAULT_TIMEOUT_S = 2.0
SERVING = "SERVING"
SERVICE_UNKNOWN = "SERVICE_UNKNOWN"
UNREACHABLE = "UNREACHABLE"


@dataclass(frozen=True, slots=True)
class HealthCheck:
    """What one Check said about a service of the server at `address`."""

    address: str
    service: str
    """The service asked about; "" is the whole server."""
    status: str
    """A grpc.health.v1 ServingStatus name (SERVING, NOT_SERVING, UNKNOWN), SERVICE_UNKNOWN (the server has no
    such service), or UNREACHABLE (no answer: refused, timed out, no health service)."""
    detail: str = ""
    """Why, for SERVICE_UNKNOWN and UNREACHABLE: the gRPC status code and message."""

    @property
    def serving(self) -> bool:
        return self.status == SERVING

    def describe(self) -> str:
        """One line: `ADDRESS[ SERVICE]: STATUS[ (detail)]`."""
        target = f"{self.address} {self.service}" if self.service else self.address
        return f"{target}: {self.status}" + (f" ({self.detail})" if self.detail else "")


async def check_health(
    address: str,
    service: str = "",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    security: ChannelSecurity | None = None,
    token: str | None = None,
) -> HealthCheck:
    """Ask the server at `address` (host:port) once whether `service` serves, dialing with `security` (default:
    plain text) and presenting `token` (a router started with --no-auth-exempt-health); never raises for gRPC
    errors."""
    async with (security or ChannelSecurity()).aio_channel(address) as channel:
        # NOTE: called by method path because the grpcio-health-checking stubs do not type HealthStub's methods.
        check = channel.unary_unary(
            f"/{health.SERVICE_NAME}/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        try:
            response = await check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s, metadata=bearer_metadata(token)
            )
        except grpc.aio.AioRpcError as exc:
            message = " ".join((exc.details() or "").split())
            detail = f"{exc.code().name}: {message}" if message else exc.code().name
            status = SERVICE_UNKNOWN if exc.code() == grpc.StatusCode.NOT_FOUND else UNREACHABLE
            return HealthCheck(address, service, status, detail)
    return HealthCheck(address, service, health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))
