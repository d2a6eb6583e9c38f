"""`python -m decode_service` / `pdserve decode`: a decode pod.

Start order (`pod.run.run_pod`): gRPC server up with health NOT_SERVING -> load the engine -> KV receiver ->
register in Redis -> SERVING -> the line `pdserve decode serving on <host:port>` on stdout. SIGTERM/SIGINT: drain,
deregister, exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc.aio

from common.tls import kv_server_context
from decode_service.decode_worker import DecodeWorker
from decode_service.server import SERVICE_NAME, DecodeServicer
from engine.llm_engine import LLMEngine
from kv_transfer.factory import make_pod_receiver
from pdserve.v1 import decode_pb2_grpc
from pod.admission import Admission
from pod.config import KVReceiverConfig, PodConfig, parse_pod_config
from pod.run import configure_logging
from pod.run import run_pod as run_any_pod
from pod.runtime import PodRuntime
from pod.worker import PodWorker

logger = logging.getLogger("decode_service")


def parse_args(argv: list[str] | None = None) -> PodConfig:
    """The pod's config from its flags (bad values exit with a usage error)."""
    return parse_pod_config("decode", argv, with_receiver=True)


async def run_pod(config: PodConfig, stop: asyncio.Event | None = None, handle_signals: bool = False) -> int:
    """Serve until `stop` is set (or a signal arrives, with `handle_signals`), then drain; returns the exit code."""
    servicer = DecodeServicer()
    receiver_config = config.receiver or KVReceiverConfig()

    def add_servicer(server: grpc.aio.Server) -> str:
        decode_pb2_grpc.add_DecodeServiceServicer_to_server(servicer, server)
        return SERVICE_NAME

    @asynccontextmanager
    async def open_worker(engine: LLMEngine, runtime: PodRuntime) -> AsyncIterator[PodWorker]:
        # NOTE: a parallel engine gives one view per rank: one receiver per rank (on --kv-port + rank) takes it.
        receiver = make_pod_receiver(
            config.transfer.kv_transfer_backend,
            engine.kv_pool_views(),
            config.server.host,
            receiver_config.kv_port,
            advertise_host=config.server.public_host,
            ssl_context=kv_server_context(config.tls),
        )
        worker = DecodeWorker(
            engine,
            receiver,
            config.transfer.kv_transfer_backend,
            config.transfer.kv_lease_s,
            generation=runtime.generation,
            tracing=runtime.tracing,
            metrics=runtime.metrics,
            admission=Admission(config.admission.limits(engine.scheduler.config)),
            engine_nice=config.server.engine_nice_on(engine.info.device),
        )
        worker.start()
        logger.info("KV receiver (%s) on %s", config.transfer.kv_transfer_backend, worker.kv_endpoint)
        servicer.worker = worker
        try:
            yield worker
        finally:
            await worker.aclose()

    return await run_any_pod("decode", config, add_servicer, open_worker, stop, handle_signals)


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    configure_logging()
    return asyncio.run(run_pod(config, handle_signals=True))


if __name__ == "__main__":
    sys.exit(main())
