"""`python -m prefill_service` / `pdserve prefill`: a prefill pod.

Start order: gRPC server up with health NOT_SERVING -> load the engine -> KV sender and directory publisher ->
register in Redis -> SERVING -> the line `pdserve prefill serving on <host:port>` on stdout. SIGTERM/SIGINT: drain,
deregister, drop the pod's prefix directory entries, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from dataclasses import dataclass

from common.config import add_config_args, config_from_args
from common.errors import InvalidArgumentError
from common.prefix_directory import PrefixDirectory
from common.telemetry_config import TelemetryConfig
from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, engine_config_from_args
from kv_transfer.factory import make_sender
from pdserve.v1 import prefill_pb2_grpc
from pod.config import PodServerConfig, PodTransferConfig, RegistryConfig
from pod.runtime import PodRuntime, load_engine
from prefill_service.directory_publisher import DirectoryPublisher
from prefill_service.prefill_worker import PrefillWorker
from prefill_service.server import SERVICE_NAME, PrefillServicer

logger = logging.getLogger("prefill_service")


@dataclass(frozen=True, slots=True)
class PrefillPodConfig:
    server: PodServerConfig
    registry: RegistryConfig
    transfer: PodTransferConfig
    engine: EngineConfig
    telemetry: TelemetryConfig


def parse_args(argv: list[str] | None = None) -> PrefillPodConfig:
    """The pod's config from its flags (bad values exit with a usage error)."""
    parser = argparse.ArgumentParser(prog="pdserve prefill", description="Run a prefill pod.")
    parts = (PodServerConfig, RegistryConfig, PodTransferConfig, ModelConfig, CacheConfig, SchedulerConfig,
             TelemetryConfig)  # fmt: skip
    for cls in parts:
        add_config_args(parser, cls)
    args = parser.parse_args(argv)
    try:
        return PrefillPodConfig(
            config_from_args(PodServerConfig, args),
            config_from_args(RegistryConfig, args),
            config_from_args(PodTransferConfig, args),
            engine_config_from_args(args),
            config_from_args(TelemetryConfig, args),
        )
    except InvalidArgumentError as exc:
        parser.error(f"--{exc.field.replace('_', '-')}: {exc.description}")


async def run_pod(config: PrefillPodConfig, stop: asyncio.Event | None = None, handle_signals: bool = False) -> int:
    """Serve until `stop` is set (or a signal arrives, with `handle_signals`), then drain; returns the exit code."""
    runtime = PodRuntime("prefill", config.engine.model.model, config.server, config.registry, config.telemetry, stop)
    servicer = PrefillServicer()
    prefill_pb2_grpc.add_PrefillServiceServicer_to_server(servicer, runtime.server)
    await runtime.start_server([SERVICE_NAME])
    if handle_signals:
        runtime.install_signal_handlers()
    publisher = DirectoryPublisher(PrefixDirectory(config.registry.redis_url), runtime.pod_id, runtime.generation)
    worker: PrefillWorker | None = None
    try:
        engine = await load_engine(config.engine)
        transfer = config.transfer
        sender = make_sender(
            transfer.kv_transfer_backend,
            engine.runner.kv_cache,
            engine.info.block_size,
            lease_s=transfer.kv_lease_s,
            connect_timeout_s=transfer.kv_connect_timeout_s,
        )
        worker = PrefillWorker(
            engine,
            sender,
            transfer.kv_transfer_backend,
            transfer.kv_lease_s,
            on_kv_events=publisher.offer,
            tracing=runtime.tracing,
            metrics=runtime.metrics,
        )
        publisher.start()
        worker.start()
        servicer.worker = worker
        await runtime.go_live(worker)
        await runtime.stopping.wait()
        await runtime.drain(config.server.drain_timeout_s)
    finally:
        await runtime.stop()
        if worker is not None:
            await worker.aclose()
        await publisher.aclose()
        await runtime.close_telemetry()
    return 0


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(run_pod(config, handle_signals=True))


if __name__ == "__main__":
    sys.exit(main())
