"""The autoscaler with its I/O: `Autoscaler` wires the registry in Redis, the driver, the connector and the
/metrics endpoint; `pdserve autoscale` runs it in its main thread (`run`), `pdserve up --autoscale` beside
the cluster on a thread of its own (`start_thread`, then `stop_thread`).

Lifecycle: construct (the connector is built on the autoscaler's metrics registry) -> `serve_metrics` (optional)
-> `run(stop)` until `stop` is set -> the connector is closed, the registry client and /metrics endpoint too.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from autoscaler.config import AutoscalerConfig
from autoscaler.connector import Connector
from autoscaler.driver import AutoscaleDriver
from autoscaler.metrics import AutoscalerMetrics
from common.pod_registry import PodRegistry
from common.redis_client import redact

logger = logging.getLogger(__name__)

ConnectorFactory = Callable[[CollectorRegistry], Connector]
"""Builds the connector; it may add its own series to the autoscaler's metrics registry."""


class Autoscaler:
    """One autoscaler over the pod registry at `redis_url`."""

    def __init__(self, config: AutoscalerConfig, redis_url: str, make_connector: ConnectorFactory) -> None:
        self.config = config
        self._redis_url = redis_url
        self.registry = CollectorRegistry()
        self._metrics = AutoscalerMetrics(self.registry)
        self._connector = make_connector(self.registry)
        self._server: WSGIServer | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def serve_metrics(self, port: int, host: str = "0.0.0.0") -> int:
        """Serve /metrics on `host:port` (0: a free port) from a daemon thread; the bound port."""
        self._server, _ = start_http_server(port, host, registry=self.registry)
        return int(self._server.server_port)

    async def run(self, stop: threading.Event) -> None:
        """Drive the planner until `stop` is set; then close the connector, the registry client and /metrics."""
        pods = PodRegistry(self._redis_url)
        driver = AutoscaleDriver(self.config, pods.list_pods, self._connector, self._metrics)
        logger.info(
            "autoscaler: deciding every %g s on the registry at %s",
            self.config.autoscale_interval_s,
            redact(self._redis_url),
        )
        try:
            await driver.run(stop)
        finally:
            await pods.aclose()
            if self._server is not None:
                self._server.shutdown()
                self._server.server_close()

    def start_thread(self) -> None:
        """`run` on a daemon thread of its own (with its own event loop), until `stop_thread`."""
        self._thread = threading.Thread(target=self._run_logged, name="pdserve-autoscaler", daemon=True)
        self._thread.start()

    def stop_thread(self, timeout_s: float = 10.0) -> None:
        """Stop the thread `start_thread` started and wait up to `timeout_s` for it. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run_logged(self) -> None:
        try:
            asyncio.run(self.run(self._stop))
        except Exception:
            logger.exception("autoscaler: stopped by an error; the cluster keeps its current pods")
