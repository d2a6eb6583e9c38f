"""uvicorn inside the router process, on the event loop of the gRPC server, so both APIs share one lifecycle.

With the public port's TLS configured (`--tls-cert/--tls-key`, common.tls.PublicTLSConfig) it serves HTTPS with the
same certificate and key. `start()` binds the port itself (0 picks a free one, known at once) and runs
`uvicorn.Server.serve` as a task; `close(grace_s)` stops accepting, lets open responses finish for `grace_s`, then
cancels them. The router keeps its own SIGTERM/SIGINT handling: uvicorn's signal capture is turned off. With
`reuse_port` (a router of several processes, router.processes.supervisor) the socket shares its port with its siblings'
(SO_REUSEPORT): the kernel spreads connections over them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator

import uvicorn
from starlette.applications import Starlette

from common.tls import PublicTLSConfig

logger = logging.getLogger(__name__)


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves the process's signals to its owner."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    """The HTTP API's server: `app` on `host:port`, over TLS with the public port's certificate when `tls` is on."""

    def __init__(
        self, app: Starlette, host: str, port: int, tls: PublicTLSConfig | None = None, reuse_port: bool = False
    ) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        self._socket.bind((host, port))
        self.port: int = self._socket.getsockname()[1]
        """The bound port."""
        tls = tls or PublicTLSConfig()
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_keep_alive=30,
            ssl_certfile=tls.tls_cert,
            ssl_keyfile=tls.tls_key,
        )
        self.scheme = "https" if tls.enabled else "http"
        self._server = _EmbeddedServer(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Serve in the background; returns once the server accepts connections."""
        self._task = asyncio.create_task(self._server.serve(sockets=[self._socket]), name="http-server")
        while not self._server.started:
            if self._task.done():
                await self._task
                raise RuntimeError("the HTTP server stopped while starting")
            await asyncio.sleep(0.01)

    async def close(self, grace_s: float | None) -> None:
        """Stop accepting; open responses get `grace_s` (None: cancelled now)."""
        if self._task is None:
            self._socket.close()
            return
        self._server.config.timeout_graceful_shutdown = round(grace_s or 0)
        self._server.should_exit = True
        await asyncio.gather(self._task, return_exceptions=True)
