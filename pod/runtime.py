"""The life of a prefill or decode pod's process around its gRPC server, shared by both roles.

0. Construction sets up the pod's telemetry: tracing (off unless an OTLP endpoint is configured; its interceptor
   first in the server's list) and metrics (`/metrics` served from `start_server` when a port is configured).
1. `start_server`: bind and start the server (mutual TLS with the cluster CA when `tls` is set: callers need a
   certificate it signed); health says NOT_SERVING while the engine loads.
2. `go_live(front)`: register in the pod registry (with the front's load), heartbeat every `heartbeat_s`,
   health SERVING, and print the serving line `pdserve <role> serving on <host:port>` to stdout.
3. `stopping` is set (SIGTERM/SIGINT with `install_signal_handlers`, or by the caller); then `drain`: the front
   refuses new requests, the registry entry says draining and health NOT_SERVING, in-flight requests finish
   (bounded by `drain_timeout_s`), and the entry is removed.
4. `stop`: the server stops and the registry client closes; `close_telemetry` (after the front closed) exports
   the last spans and stops `/metrics`.
The heartbeat reads the front's load snapshot, never waiting for the engine core: a long step (an unchunked
prefill) must not outlast the registry TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
import uuid
from collections.abc import Sequence

import grpc.aio

from common.errors import UnavailableError
from common.grpc.errors import FIELD_PATHS, ErrorInterceptor
from common.grpc.server import HealthState, add_port, add_standard_services, message_size_options
from common.metrics import ServiceMetrics
from common.pod_registry import PodInfo, PodRegistry, PodRole
from common.telemetry import Tracing, setup_tracing
from common.telemetry_config import TelemetryConfig
from common.tls import ClusterTLSConfig, internal_server_credentials
from engine.config import ParallelConfig
from kv_transfer.control.address import format_endpoint
from pod.config import PodServerConfig, RegistryConfig
from pod.front import PodFront

logger = logging.getLogger(__name__)

POD_FIELD_PATHS = {**FIELD_PATHS, "prompt": "prompt_token_ids"}
"""Engine field names -> fields of PrefillRequest / DecodeRequest (the prompt is token ids there)."""

_DRAIN_POLL_S = 0.05
_STOP_GRACE_S = 1.0


class PodRuntime:
    """Server start/stop, health, registry entry + heartbeat, signals and draining of one pod."""

    def __init__(
        self,
        role: PodRole,
        model: str,
        server_config: PodServerConfig,
        registry_config: RegistryConfig,
        telemetry_config: TelemetryConfig | None = None,
        stopping: asyncio.Event | None = None,
        tls: ClusterTLSConfig | None = None,
        parallel: ParallelConfig | None = None,
    ) -> None:
        """`parallel`: the engine's TP/PP sizes, which the registry entry announces (default: one device)."""
        self.role = role
        self._parallel = parallel or ParallelConfig()
        self._tls = tls or ClusterTLSConfig()
        self.pod_id = registry_config.pod_id or f"{role}-{uuid.uuid4().hex[:8]}"
        self.generation = time.time_ns()
        self._telemetry_config = telemetry_config or TelemetryConfig()
        self.tracing: Tracing = setup_tracing(self._telemetry_config, role, instance_id=self.pod_id)
        self.metrics = ServiceMetrics(role)
        self.metrics_port: int | None = None
        # NOTE: tracing first, so that its SERVER span sees the status the ErrorInterceptor sets.
        # NOTE: the router pings its pod channels every second (router.pods.pod_client.KEEPALIVE_OPTIONS) to see a
        # stopped or vanished pod in seconds; the server's defaults would answer such pings with GOAWAY.
        self.server = grpc.aio.server(
            interceptors=[*self.tracing.server_interceptors(), ErrorInterceptor(POD_FIELD_PATHS)],
            options=[
                ("grpc.http2.min_ping_interval_without_data_ms", 500),
                ("grpc.keepalive_permit_without_calls", 1),
                *message_size_options(),
            ],
        )
        self.stopping = stopping or asyncio.Event()
        self.address = ""
        self._model = model
        self._server_config = server_config
        self._heartbeat_s = registry_config.heartbeat_s
        # NOTE: the entry outlives two missed heartbeats, so one slow beat never drops a live pod.
        self._registry = PodRegistry(registry_config.redis_url, ttl_s=3 * registry_config.heartbeat_s)
        self._health: HealthState | None = None
        self._front: PodFront | None = None
        self._draining = False
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._heartbeat_stopped = asyncio.Event()

    async def start_server(self, service_names: Sequence[str]) -> None:
        """Add health and reflection, bind, and start serving NOT_SERVING; sets `address`."""
        self._health = add_standard_services(self.server, service_names)
        config = self._server_config
        port = add_port(self.server, format_endpoint(config.host, config.port), internal_server_credentials(self._tls))
        self.address = format_endpoint(config.public_host, port)
        await self.server.start()
        logger.info("%s %s: gRPC server on %s (NOT_SERVING until loaded)", self.role, self.pod_id, self.address)
        telemetry = self._telemetry_config
        self.metrics_port = self.metrics.start_http_server(telemetry.metrics_port, telemetry.metrics_host)
        if self.metrics_port is not None:
            logger.info(
                "%s %s: metrics on %s:%d/metrics", self.role, self.pod_id, telemetry.metrics_host, self.metrics_port
            )

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT set `stopping` (the caller then drains)."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal, signum)

    async def go_live(self, front: PodFront) -> None:
        """Register with the front's load, start the heartbeat, report SERVING and print the serving line."""
        self._front = front
        await self._beat(quiet=False)
        self._heartbeat_task = asyncio.create_task(self._heartbeat_loop(), name="pod-heartbeat")
        await self._require_health().set_serving()
        logger.info("%s %s serving on %s (generation %d)", self.role, self.pod_id, self.address, self.generation)
        print(f"pdserve {self.role} serving on {self.address}", flush=True)

    async def drain(self, timeout_s: float) -> None:
        """Refuse new requests, announce draining, let in-flight ones finish (bounded), deregister."""
        self._draining = True
        if self._front is not None:
            self._front.start_draining()
        await self._require_health().set_not_serving()
        if self._front is not None:
            await self._beat(quiet=False)
            await self._wait_idle(self._front, timeout_s)
        await self._stop_heartbeat()
        try:
            await self._registry.deregister(self.pod_id)
        except UnavailableError as exc:
            logger.warning("could not deregister %s (its entry lapses with its TTL): %s", self.pod_id, exc)
        logger.info("%s %s drained and deregistered", self.role, self.pod_id)

    async def stop(self) -> None:
        """Stop the heartbeat and the server, close the registry client."""
        await self._stop_heartbeat()
        await self.server.stop(_STOP_GRACE_S)
        await self._registry.aclose()

    async def close_telemetry(self) -> None:
        """Export the spans still queued and stop the /metrics endpoint; last, after the front has closed."""
        await self.tracing.aclose()
        self.metrics.close()

    def _on_signal(self, signum: int) -> None:
        if self.stopping.is_set():
            logger.info("%s received again; already draining", signal.Signals(signum).name)
            return
        logger.info("%s received: draining %s", signal.Signals(signum).name, self.pod_id)
        self.stopping.set()

    async def _wait_idle(self, front: PodFront, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while front.num_in_flight and time.monotonic() < deadline:
            await asyncio.sleep(_DRAIN_POLL_S)
        if front.num_in_flight:
            logger.warning("drain timed out after %.1f s with %d requests in flight", timeout_s, front.num_in_flight)

    def _pod_info(self, front: PodFront) -> PodInfo:
        load = front.load()
        return PodInfo(
            pod_id=self.pod_id,
            role=self.role,
            address=self.address,
            model=self._model,
            generation=self.generation,
            kv_endpoint=front.kv_endpoint,
            draining=self._draining,
            num_running=load.num_running,
            num_waiting=load.num_waiting,
            num_free_blocks=load.num_free_blocks,
            num_total_blocks=load.num_total_blocks,
            num_reserved_blocks=load.num_reserved_blocks,
            queued_prompt_tokens=load.queued_prompt_tokens,
            step_ms=round(load.step_ms, 3),
            tensor_parallel_size=self._parallel.tensor_parallel_size,
            pipeline_parallel_size=self._parallel.pipeline_parallel_size,
        )

    async def _beat(self, quiet: bool) -> bool:
        """One heartbeat; False (logged unless `quiet`) if Redis failed. The entry is rewritten whole each time,
        so a beat after an outage (or a Redis restart) registers the pod again."""
        assert self._front is not None
        try:
            await self._registry.heartbeat(self._pod_info(self._front))
        except Exception as exc:  # Redis down: keep beating, log once per outage.
            if not quiet:
                logger.warning("pod heartbeat failing, will keep trying every %.2f s: %s", self._heartbeat_s, exc)
            return False
        return True

    async def _heartbeat_loop(self) -> None:
        failing = False
        while not self._heartbeat_stopped.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._heartbeat_stopped.wait(), self._heartbeat_s)
            if self._heartbeat_stopped.is_set():
                return
            ok = await self._beat(quiet=failing)
            if ok and failing:
                logger.info("pod heartbeat recovered")
            failing = not ok

    async def _stop_heartbeat(self) -> None:
        """Let the heartbeat finish its beat in progress and end.

        NOTE: never cancelled mid-beat: a beat awaits Redis, and a cancellation there can be
        swallowed by a client library (the loop would then beat forever) or leave a half-done call.
        """
        self._heartbeat_stopped.set()
        task, self._heartbeat_task = self._heartbeat_task, None
        if task is not None:
            await task

    def _require_health(self) -> HealthState:
        if self._health is None:
            raise RuntimeError("start_server() first")
        return self._health
