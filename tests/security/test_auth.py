"""Bearer-token auth: the plain authenticator's answers, the token sources, and the interceptor on a real gRPC server
(health servicer, in-process): a call without a token is UNAUTHENTICATED, a wrong one PERMISSION_DENIED, and the
health service answers without one unless told otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health, health_pb2

from cli.health import HealthCheck, check_health
from common.auth import (
    AuthConfig,
    AuthInterceptor,
    PermissionDeniedError,
    TokenAuthenticator,
    UnauthenticatedError,
    authenticator_for,
    bearer_metadata,
    load_tokens,
)
from common.errors import InvalidArgumentError
from common.grpc.errors import ErrorInterceptor
from common.grpc.server import add_standard_services

GENERATE = "/pdserve.v1.GenerationService/Generate"


def test_the_authenticator_answers_by_token() -> None:
    auth = TokenAuthenticator(["alpha", "beta"])
    auth.check(GENERATE, "Bearer beta")
    auth.check("/grpc.health.v1.Health/Check", None)
    with pytest.raises(UnauthenticatedError):
        auth.check(GENERATE, None)
    with pytest.raises(UnauthenticatedError):
        auth.check(GENERATE, "Basic YWxwaGE=")
    for wrong in ("Bearer alph", "Bearer alphaa", "Bearer "):
        with pytest.raises(PermissionDeniedError):
            auth.check(GENERATE, wrong)
    strict = TokenAuthenticator(["alpha"], exempt_services=())
    with pytest.raises(UnauthenticatedError):
        strict.check("/grpc.health.v1.Health/Check", None)


def test_tokens_come_from_a_file_and_a_list(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# team a\nalpha\n\n  beta  \n")
    assert load_tokens(AuthConfig(auth_tokens_file=str(path), auth_tokens="gamma, delta")) == (
        "alpha",
        "beta",
        "gamma",
        "delta",
    )
    assert load_tokens(AuthConfig()) == ()
    assert authenticator_for(AuthConfig()) is None
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(InvalidArgumentError, match="holds no token"):
        load_tokens(AuthConfig(auth_tokens_file=str(tmp_path / "empty")))
    with pytest.raises(InvalidArgumentError, match="cannot read"):
        load_tokens(AuthConfig(auth_tokens_file=str(tmp_path / "missing")))


async def _check_health(config: AuthConfig, metadata: Sequence[tuple[str, str]]) -> grpc.StatusCode:
    """One health Check on a server with `config`'s auth; the call's status code."""
    authenticator = authenticator_for(config)
    assert authenticator is not None
    server = grpc.aio.server(interceptors=[AuthInterceptor(authenticator), ErrorInterceptor()])
    await add_standard_services(server, []).set_serving()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            check = channel.unary_unary(
                f"/{health.SERVICE_NAME}/Check",
                request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                response_deserializer=health_pb2.HealthCheckResponse.FromString,
            )
            try:
                await check(health_pb2.HealthCheckRequest(), metadata=tuple(metadata), timeout=5.0)
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            return grpc.StatusCode.OK
    finally:
        await server.stop(None)


def test_the_interceptor_refuses_calls_on_a_real_server() -> None:
    strict = AuthConfig(auth_tokens="alpha", auth_exempt_health=False)
    codes = {
        "none": asyncio.run(_check_health(strict, ())),
        "wrong": asyncio.run(_check_health(strict, bearer_metadata("beta"))),
        "right": asyncio.run(_check_health(strict, bearer_metadata("alpha"))),
        "exempt": asyncio.run(_check_health(AuthConfig(auth_tokens="alpha"), ())),
    }
    assert codes == {
        "none": grpc.StatusCode.UNAUTHENTICATED,
        "wrong": grpc.StatusCode.PERMISSION_DENIED,
        "right": grpc.StatusCode.OK,
        "exempt": grpc.StatusCode.OK,
    }


def test_pdserve_health_presents_its_token() -> None:
    """`pdserve health --token` against a router whose health needs one (--no-auth-exempt-health)."""

    async def checks() -> tuple[HealthCheck, HealthCheck]:
        authenticator = authenticator_for(AuthConfig(auth_tokens="alpha", auth_exempt_health=False))
        assert authenticator is not None
        server = grpc.aio.server(interceptors=[AuthInterceptor(authenticator), ErrorInterceptor()])
        await add_standard_services(server, []).set_serving()
        address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        try:
            return await check_health(address), await check_health(address, token="alpha")
        finally:
            await server.stop(None)

    without, with_token = asyncio.run(checks())
    assert (without.status, without.detail.split(":")[0]) == ("UNREACHABLE", "UNAUTHENTICATED")
    assert with_token.status == "SERVING"
