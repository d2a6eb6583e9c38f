"""The router's HTTP API over TLS (router.http.http_server): the public port's certificate and key serve HTTPS; a
client that trusts the cluster CA gets its answer, plain HTTP and a client without the CA get none."""

from __future__ import annotations

import ssl

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from cli.credentials import ClusterCredentials
from common.tls import PublicTLSConfig
from router.http.http_server import HttpServer


async def _health(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


@pytest.mark.anyio
async def test_the_http_api_serves_https_with_the_public_certificate(credentials: ClusterCredentials) -> None:
    tls = PublicTLSConfig(str(credentials.cert("public")), str(credentials.key("public")))
    server = HttpServer(Starlette(routes=[Route("/health", _health)]), "127.0.0.1", 0, tls)
    await server.start()
    try:
        assert server.scheme == "https"
        trusting = ssl.create_default_context(cafile=str(credentials.ca))
        async with httpx.AsyncClient(verify=trusting, timeout=10.0) as client:
            response = await client.get(f"https://127.0.0.1:{server.port}/health")
        assert (response.status_code, response.json()) == (200, {"status": "ok"})
        async with httpx.AsyncClient(timeout=10.0) as client:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await client.get(f"https://127.0.0.1:{server.port}/health")
            with pytest.raises(httpx.RemoteProtocolError):
                await client.get(f"http://127.0.0.1:{server.port}/health")
    finally:
        await server.close(None)
