"""`python -m decode_service` / `pdserve decode`: a decode pod.

Start order: gRPC server up with health NOT_SERVING -> load the engine -> KV receiver -> register in Redis ->
SERVING -> the line `pdserve decode serving on <host:port>` on stdout. SIGTERM/SIGINT: drain, deregister, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from dataclasses import dataclass

from common.config import add_config_args, config_from_args
from common.errors import InvalidArgumentError
from common.telemetry_config import TelemetryConfig
from decode_service.decode_worker import DecodeWorker
from decode_service.server import SERVICE_NAME, DecodeServicer
from engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig, engine_config_from_args
from kv_transfer.factory import make_receiver
from pdserve.v1 import decode_pb2_grpc
from pod.config import KVReceiverConfig, PodServerConfig, PodTransferConfig, RegistryConfig
from pod.runtime import PodRuntime, load_engine

logger = logging.getLogger("decode_service")


@dataclass(frozen=True, slots=True)
class DecodePodConfig:
    server: PodServerConfig
    registry: RegistryConfig
    transfer: PodTransferConfig
    receiver: KVReceiverConfig
    engine: EngineConfig
    telemetry: TelemetryConfig


def parse_args(argv: list[str] | None = None) -> DecodePodConfig:
    """The pod's config from its flags (bad values exit with a usage error)."""
    parser = argparse.ArgumentParser(prog="pdserve decode", description="Run a decode pod.")
    parts = (
        PodServerConfig,
        RegistryConfig,
        PodTransferConfig,
        KVReceiverConfig,
        ModelConfig,
        CacheConfig,
        SchedulerConfig,
        TelemetryConfig,
    )
    for cls in parts:
        add_config_args(parser, cls)
    args = parser.parse_args(argv)
    try:
        return DecodePodConfig(
            config_from_args(PodServerConfig, args),
            config_from_args(RegistryConfig, args),
            config_from_args(PodTransferConfig, args),
            config_from_args(KVReceiverConfig, args),
            engine_config_from_args(args),
            config_from_args(TelemetryConfig, args),
        )
    except InvalidArgumentError as exc:
        parser.error(f"--{exc.field.replace('_', '-')}: {exc.description}")


async def run_pod(config: DecodePodConfig, stop: asyncio.Event | None = None, handle_signals: bool = False) -> int:
    """Serve until `stop` is set (or a signal arrives, with `handle_signals`), then drain; returns the exit code."""
    runtime = PodRuntime("decode", config.engine.model.model, config.server, config.registry, config.telemetry, stop)
    servicer = DecodeServicer()
    decode_pb2_grpc.add_DecodeServiceServicer_to_server(servicer, runtime.server)
    await runtime.start_server([SERVICE_NAME])
    if handle_signals:
        runtime.install_signal_handlers()
    worker: DecodeWorker | None = None
    try:
        engine = await load_engine(config.engine)
        receiver = make_receiver(
            config.transfer.kv_transfer_backend,
            engine.runner.kv_cache,
            engine.info.block_size,
            config.server.host,
            config.receiver.kv_port,
            advertise_host=config.server.public_host,
        )
        worker = DecodeWorker(
            engine,
            receiver,
            config.transfer.kv_transfer_backend,
            config.transfer.kv_lease_s,
            tracing=runtime.tracing,
            metrics=runtime.metrics,
        )
        worker.start()
        logger.info("KV receiver (%s) on %s", config.transfer.kv_transfer_backend, worker.endpoint)
        servicer.worker = worker
        await runtime.go_live(worker, kv_endpoint=worker.endpoint)
        await runtime.stopping.wait()
        await runtime.drain(config.server.drain_timeout_s)
    finally:
        await runtime.stop()
        if worker is not None:
            await worker.aclose()
        await runtime.close_telemetry()
    return 0


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(run_pod(config, handle_signals=True))


if __name__ == "__main__":
    sys.exit(main())
