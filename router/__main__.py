"""`pdserve router` / `python -m router`: the public gRPC front door.

Serves pdserve.v1.GenerationService (plus health and reflection; NOT_SERVING until the tokenizer
pool is up) and prints `pdserve router serving on <host:port>` once ready. SIGTERM or SIGINT:
NOT_SERVING, new calls refused, in-flight calls get `_DRAIN_GRACE_S` to finish, then exit 0.
Telemetry (common.telemetry_config flags): OTLP traces when an endpoint is known (else no exporter at all),
Prometheus /metrics on `--metrics-port`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import grpc.aio

from common.config import add_config_args, config_from_args
from common.errors import InvalidArgumentError
from common.grpc_errors import ErrorInterceptor
from common.grpc_server import add_standard_services
from common.metrics import ServiceMetrics
from common.pod_registry import PodRegistry
from common.prefix_directory import PrefixDirectory
from common.telemetry import setup_tracing
from common.telemetry_config import TelemetryConfig
from engine.model_store import resolve_model
from pdserve.v1 import generation_pb2_grpc
from router.completion_run import RunContext
from router.config import RouterConfig, RoutingConfig
from router.local_load import LocalLoads
from router.model_info import ModelInfo
from router.pod_view import PodView
from router.request_lifecycle import RequestLifecycle
from router.routing_policy import RoutingPolicy
from router.server import SERVICE_NAME, GenerationServicer
from router.tokenizer_pool import TokenizerPool, load_tokenizer

logger = logging.getLogger("router")

_DRAIN_GRACE_S = 30.0


def parse_args(argv: Sequence[str] | None) -> tuple[RouterConfig, RoutingConfig, TelemetryConfig]:
    parser = argparse.ArgumentParser(prog="pdserve router", description="The public gRPC front door of pdserve.")
    add_config_args(parser, RouterConfig)
    add_config_args(parser, RoutingConfig)
    add_config_args(parser, TelemetryConfig)
    args = parser.parse_args(argv)
    try:
        return (
            config_from_args(RouterConfig, args),
            config_from_args(RoutingConfig, args),
            config_from_args(TelemetryConfig, args),
        )
    except InvalidArgumentError as exc:
        parser.error(f"--{exc.field.replace('_', '-')}: {exc.description}")


async def serve(config: RouterConfig, routing: RoutingConfig, telemetry: TelemetryConfig) -> None:
    """Run the router until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    folder = await asyncio.to_thread(resolve_model, config.model)
    model = ModelInfo.from_folder(config.model, folder, config.block_size)
    tracing = setup_tracing(telemetry, "router")
    if not tracing.enabled:
        logger.info("tracing off: no OTLP endpoint, no exporter")
    metrics = ServiceMetrics("router")
    metrics_port = metrics.start_http_server(telemetry.metrics_port, telemetry.metrics_host)
    if metrics_port is not None:
        logger.info("metrics on http://%s:%d/metrics", telemetry.metrics_host, metrics_port)
    tokenizer_folder = folder
    if config.tokenizer is not None:
        tokenizer_folder = await asyncio.to_thread(resolve_tokenizer, config.tokenizer)
    tokenizer_pool = TokenizerPool(tokenizer_folder, config.tokenizer_pool_size, metrics.observe_tokenizer_queue_time)
    tokenizer, _ = await asyncio.gather(asyncio.to_thread(load_tokenizer, tokenizer_folder), tokenizer_pool.start())
    registry = PodRegistry(config.redis_url)
    directory = PrefixDirectory(config.redis_url)
    load = LocalLoads()
    pods = PodView(
        registry, config.model, config.registry_refresh_s, load, routing.unavailable_cooldown_s,
        routing.missing_pod_grace_s, channel_interceptors=tracing.client_interceptors(),
    )  # fmt: skip
    context = RunContext(
        pods, RoutingPolicy(config.block_size, routing), load, tokenizer, config.block_size, routing.max_attempts,
        time.monotonic, tracing, metrics,
    )  # fmt: skip
    server = grpc.aio.server(interceptors=[*tracing.server_interceptors(), ErrorInterceptor()])
    lifecycle = RequestLifecycle(model, tokenizer_pool, directory, context)
    generation_pb2_grpc.add_GenerationServiceServicer_to_server(GenerationServicer(lifecycle, metrics), server)
    health = add_standard_services(server, [SERVICE_NAME])
    port = server.add_insecure_port(f"{config.host}:{config.port}")
    grace_s: float | None = None
    try:
        await server.start()
        await pods.start()
        await health.set_serving()
        print(f"pdserve router serving on {config.host}:{port}", flush=True)
        await stop.wait()
        logger.info("draining: refusing new calls, %.0f s for in-flight ones", _DRAIN_GRACE_S)
        await health.set_not_serving()
        grace_s = _DRAIN_GRACE_S
    finally:
        await server.stop(grace_s)
        await pods.aclose()
        await tokenizer_pool.aclose()
        await directory.aclose()
        await registry.aclose()
        await tracing.aclose()
        metrics.close()


def resolve_tokenizer(name: str) -> Path:
    """The folder of `--tokenizer`: a folder holding tokenizer.json as it is, else a model name (`resolve_model`)."""
    path = Path(name).expanduser()
    if (path / "tokenizer.json").is_file():
        return path
    return resolve_model(name)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `pdserve router` (argv without the subcommand)."""
    config, routing, telemetry = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(config, routing, telemetry))
    return 0


if __name__ == "__main__":
    sys.exit(main())
