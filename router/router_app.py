"""`RouterApp`: the router process's parts, wired once, for every front end it serves.

- `await RouterApp.open(config, routing, telemetry)`: SIGTERM and SIGINT set `stopping` from here on; resolve the
  model; tracing (OTLP when an endpoint is known, else no exporter at all) and Prometheus /metrics on
  `--metrics-port`; start the tokenizer pool; then, without I/O, the pod registry, the prefix directory, the pod
  view, the request `lifecycle` front ends serve, and the gRPC server: pdserve.v1.GenerationService plus health
  (NOT_SERVING) and reflection, bound to `port` (with `RouterSecurity`: TLS, bearer tokens, mTLS to the pods), and
  with `--http-port` the OpenAI-compatible HTTP API (router.http) over the same lifecycle, same tokens.
- `start()`: the gRPC (and HTTP) server starts and the pod view reads the registry. Calls are taken from here on
  (with no live pod they wait in the router's queue, router.admission.admission); health turns SERVING (HTTP /health
  200) once the pod view has seen a live prefill pod and a live decode pod, so that orchestrators send no traffic to a
  router that could only queue it. It stays SERVING if the pods leave later: calls wait for them to return (a rolling
  restart, a scale from zero), and a liveness probe on the same health must not restart the router meanwhile.
- `drain(timeout_s)`: health NOT_SERVING and `status.draining` (GetLoad: DRAINING; HTTP /health: 503 draining), so
  load balancers and clients stop sending new calls; a new Generate call (gRPC or HTTP) is refused UNAVAILABLE with a
  RetryInfo (router.admission.admission); the servers keep serving the calls in flight, health, GetLoad and the rest
  until none is left, or `timeout_s` passed.
- `close(grace_s)`: the gRPC and HTTP servers stop (in-flight calls get `grace_s`), then the pod view, the tokenizer
  pool, the directory and the registry close; queued spans are exported; /metrics stops.
As one of the processes of a router run with `--workers N` (`process`, router.processes.supervisor): both servers share
their ports with the siblings (SO_REUSEPORT), the gRPC server also listens on the process's private Unix socket, Abort
reaches the siblings' requests too (router.processes.sibling_aborts), the running requests and admission's counts are
kept in the supervisor's table (router.processes.shared_counts: admission's limits are the whole router's), the
tokenizer pool and the retry budget are this process's share, and /metrics (on `--metrics-port`, from the supervisor,
and on the HTTP port) covers every process.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from pathlib import Path

import grpc.aio
from transformers import PreTrainedTokenizerBase

from common.auth import authenticator_for
from common.grpc.errors import ErrorInterceptor
from common.grpc.server import add_port, add_standard_services, message_size_options, pending_call_options
from common.metrics import ServiceMetrics, multiprocess_registry
from common.pod_registry import PodRegistry
from common.prefix_directory import PrefixDirectory
from common.telemetry import Tracing, setup_tracing
from common.telemetry_config import TelemetryConfig
from engine.model_store import resolve_model
from pdserve.v1 import generation_pb2_grpc
from router.admission.admission import RouterAdmission
from router.completion.migration import RetryBudget
from router.completion.request_lifecycle import RequestLifecycle
from router.completion.run_context import RunContext
from router.completion.running_requests import RunningRequests
from router.config import RouterConfig, RoutingConfig
from router.http.app import HttpApi
from router.http.http_server import HttpServer
from router.http.image_urls import RemoteImages
from router.model_info import ModelInfo
from router.pods.local_load import LocalLoads
from router.pods.pod_view import PodView
from router.pods.routing_policy import RoutingPolicy
from router.processes.router_process import RouterProcess
from router.processes.shared_counts import SharedCounts, Total
from router.processes.sibling_aborts import SiblingAborts
from router.security import RouterSecurity
from router.server import SERVICE_NAME, GenerationServicer
from router.server_status import ServerStatus
from router.tokenizer.tokenizer_pool import TokenizerPool, load_tokenizer

logger = logging.getLogger("router")

_DRAIN_POLL_S = 0.05


class RouterApp:
    """One router process: the request lifecycle over the pods, its gRPC server, health and telemetry."""

    def __init__(
        self,
        config: RouterConfig,
        routing: RoutingConfig,
        model: ModelInfo,
        tokenizer_pool: TokenizerPool,
        tokenizer: PreTrainedTokenizerBase,
        tracing: Tracing,
        metrics: ServiceMetrics,
        stopping: asyncio.Event,
        security: RouterSecurity | None = None,
        process: RouterProcess | None = None,
        counts: SharedCounts | None = None,
    ) -> None:
        """Wire the parts that need no I/O; `open` makes the others and calls this. `process`: which of the router's
        processes this is (default: a lone one); `counts`: the table it shares with its siblings (default: its own)."""
        security = security or RouterSecurity()
        self.process = process = process or RouterProcess()
        self.config = config
        self.tracing = tracing
        self.metrics = metrics
        self.stopping = stopping
        """Set by SIGTERM or SIGINT."""
        self._tokenizer_pool = tokenizer_pool
        self._counts = counts = SharedCounts.local() if counts is None else counts
        self._registry = PodRegistry(config.redis_url)
        self._directory = PrefixDirectory(config.redis_url, host_hit_weight=routing.host_hit_weight)
        load = LocalLoads()
        self._pods = PodView(
            self._registry,
            config.model,
            config.registry_refresh_s,
            load,
            routing.unavailable_cooldown_s,
            routing.missing_pod_grace_s,
            channel_interceptors=tracing.client_interceptors(),
            channel_security=security.pod_channels(),
        )
        self.status = ServerStatus(
            lambda: self._pods.all_pods,
            process.tokenizer_pool_size(config.tokenizer_pool_size) * process.count,
            num_running_requests=lambda: counts.total(Total.RUNNING_REQUESTS),
            router_worker=process.index,
            num_router_workers=process.count,
        )
        """What GetServerInfo, GetLoad and HTTP /health report."""
        context = _run_context(
            config, routing, self._pods, load, tokenizer, tracing, metrics, self.status, process, counts
        )
        self._server = _grpc_server(config, security, tracing, process)
        running = RunningRequests(on_count=lambda num_running: counts.set(Total.RUNNING_REQUESTS, num_running))
        self.lifecycle = RequestLifecycle(model, tokenizer_pool, self._directory, context, config, running)
        """What every front end serves: Generate, Tokenize and the model's info."""
        self._siblings = SiblingAborts(process.sibling_addresses()) if process.grouped else None
        generation_pb2_grpc.add_GenerationServiceServicer_to_server(
            GenerationServicer(self.lifecycle, metrics, self.status, self._siblings), self._server
        )
        self._health = add_standard_services(self._server, [SERVICE_NAME])
        self.port = add_port(self._server, f"{config.host}:{config.port}", security.server_credentials())
        """The gRPC server's bound port (`config.port` 0 picks a free one)."""
        if process.grouped:
            # NOTE: plain text on a socket in the supervisor's private (0700) folder: siblings forward Aborts here.
            self._server.add_insecure_port(process.address())
        self._pods_live = asyncio.Event()
        """Set once the pod view has seen a live prefill pod and a live decode pod."""
        self._pods.add_refresh_listener(self._note_live_pods)
        self._serving_task: asyncio.Task[None] | None = None
        self._http = self._http_server(tokenizer, security) if config.http_port else None
        if self._http is not None:
            self.status.http_port = self._http.port

    def _http_server(self, tokenizer: PreTrainedTokenizerBase, security: RouterSecurity) -> HttpServer:
        """The OpenAI-compatible HTTP API over the same lifecycle, with the same tokens; with siblings, on the port
        they share, and its /metrics is the whole router's (every process's files)."""
        process = self.process
        registry = multiprocess_registry(process.metrics_dir) if process.grouped else self.metrics.registry
        auth = authenticator_for(security.auth)
        api = HttpApi(self.lifecycle, self.status, tokenizer, registry, auth, RemoteImages(self.config))
        return HttpServer(api.app(), self.config.host, self.config.http_port, security.public_tls, process.grouped)

    @classmethod
    async def open(
        cls,
        config: RouterConfig,
        routing: RoutingConfig,
        telemetry: TelemetryConfig,
        security: RouterSecurity | None = None,
        process: RouterProcess | None = None,
    ) -> RouterApp:
        """Everything up to `start` (see the module docstring); `security`: TLS, mTLS to pods, tokens (all off);
        `process`: which of the router's processes this is (default: a lone one)."""
        process = process or RouterProcess()
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopping.set)
        folder = await asyncio.to_thread(resolve_model, config.model)
        model = ModelInfo.from_folder(config.model, folder, config.block_size)
        tracing = setup_tracing(telemetry, "router")
        if not tracing.enabled:
            logger.info("tracing off: no OTLP endpoint, no exporter")
        metrics = ServiceMetrics("router")
        # NOTE: with siblings, the supervisor serves every process's metrics on --metrics-port.
        metrics_port = None
        if not process.grouped:
            metrics_port = metrics.start_http_server(telemetry.metrics_port, telemetry.metrics_host)
        if metrics_port is not None:
            logger.info("metrics on http://%s:%d/metrics", telemetry.metrics_host, metrics_port)
        tokenizer_folder = folder
        if config.tokenizer is not None:
            tokenizer_folder = await asyncio.to_thread(resolve_tokenizer, config.tokenizer)
        pool_size = process.tokenizer_pool_size(config.tokenizer_pool_size)
        tokenizer_pool = TokenizerPool(tokenizer_folder, pool_size, metrics.observe_tokenizer_queue_time)
        tokenizer, _ = await asyncio.gather(asyncio.to_thread(load_tokenizer, tokenizer_folder), tokenizer_pool.start())
        counts = SharedCounts.open(process.counts_path, process.index) if process.grouped else None
        return cls(
            config, routing, model, tokenizer_pool, tokenizer, tracing, metrics, stopping, security, process, counts
        )

    async def start(self) -> None:
        """Serve: the gRPC server starts, the pod view reads the registry; health turns SERVING once a live prefill
        pod and a live decode pod are known (at once if they are)."""
        await self._server.start()
        if self._http is not None:
            await self._http.start()
            logger.info(
                "OpenAI-compatible HTTP API on %s://%s:%d/v1", self._http.scheme, self.config.host, self._http.port
            )
        await self._pods.start()
        if self._pods_live.is_set():
            await self._set_serving()
        else:
            logger.info("health NOT_SERVING until a live prefill pod and a live decode pod are registered")
            self._serving_task = asyncio.create_task(self._serve_once_pods_live(), name="serve-once-pods-live")

    async def drain(self, timeout_s: float) -> None:
        """Health NOT_SERVING and new Generate calls refused (UNAVAILABLE): they go elsewhere; in-flight ones go on,
        and this returns once none is left or after `timeout_s`."""
        self.status.draining = True
        await self._cancel_serving_task()
        await self._health.set_not_serving()
        deadline = time.monotonic() + timeout_s
        while len(self.lifecycle.running) and time.monotonic() < deadline:
            await asyncio.sleep(_DRAIN_POLL_S)
        if num_running := len(self.lifecycle.running):
            logger.warning("drain timed out after %.1f s with %d calls in flight", timeout_s, num_running)

    async def close(self, grace_s: float | None) -> None:
        """Stop the gRPC server (in-flight calls get `grace_s`; None: cancelled now), then everything else."""
        await self._cancel_serving_task()
        await asyncio.gather(self._server.stop(grace_s), *([] if self._http is None else [self._http.close(grace_s)]))
        await self._pods.aclose()
        if self._siblings is not None:
            await self._siblings.aclose()
        await self._tokenizer_pool.aclose()
        await self._directory.aclose()
        await self._registry.aclose()
        await self.tracing.aclose()
        self.metrics.close()
        self._counts.close()

    def _note_live_pods(self) -> None:
        if self._pods.pods("prefill") and self._pods.pods("decode"):
            self._pods_live.set()

    async def _serve_once_pods_live(self) -> None:
        await self._pods_live.wait()
        logger.info("a live prefill pod and a live decode pod are known: health SERVING")
        await self._set_serving()

    async def _set_serving(self) -> None:
        await self._health.set_serving()
        self.status.serving = True

    async def _cancel_serving_task(self) -> None:
        if self._serving_task is not None:
            self._serving_task.cancel()
            await asyncio.gather(self._serving_task, return_exceptions=True)
            self._serving_task = None


def resolve_tokenizer(name: str) -> Path:
    """The folder of `--tokenizer`: a folder holding tokenizer.json as it is, else a model name (`resolve_model`)."""
    path = Path(name).expanduser()
    if (path / "tokenizer.json").is_file():
        return path
    return resolve_model(name)


def _grpc_server(
    config: RouterConfig, security: RouterSecurity, tracing: Tracing, process: RouterProcess
) -> grpc.aio.Server:
    """The gRPC server with its interceptors; with siblings, its port shared with theirs (SO_REUSEPORT)."""
    options = [*message_size_options(config.max_message_bytes), *pending_call_options(config.max_pending_calls)]
    if process.grouped:
        # NOTE: gRPC sets SO_REUSEPORT on Linux unless told not to; said here, since the siblings depend on it.
        options.append(("grpc.so_reuseport", 1))
    interceptors = [*security.server_interceptors(), *tracing.server_interceptors(), ErrorInterceptor()]
    return grpc.aio.server(interceptors=interceptors, options=options)


def _run_context(
    config: RouterConfig,
    routing: RoutingConfig,
    pods: PodView,
    load: LocalLoads,
    tokenizer: PreTrainedTokenizerBase,
    tracing: Tracing,
    metrics: ServiceMetrics,
    status: ServerStatus,
    process: RouterProcess,
    counts: SharedCounts,
) -> RunContext:
    """What every completion the router runs shares: pods, policy, loads, admission (closed while `status` says
    draining; its limits counted in `counts`, the whole router's) and the retry budget (this process's share of the
    router's)."""
    admission = RouterAdmission(
        config, lambda role: len(pods.pods(role)), lambda: status.draining, time.monotonic, counts
    )
    pods.add_refresh_listener(admission.on_pods_refreshed)
    burst = max(1, int(process.share(routing.retry_budget_burst)))
    retry_budget = RetryBudget(process.share(routing.retry_budget_per_s), burst)
    return RunContext(
        pods,
        RoutingPolicy(config.block_size, routing),
        load,
        tokenizer,
        config.block_size,
        routing.max_attempts,
        time.monotonic,
        admission,
        tracing,
        metrics,
        retry_budget,
    )
