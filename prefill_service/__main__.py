"""`python -m prefill_service` / `pdserve prefill`: a prefill pod.

Start order (`pod.run.run_pod`): gRPC server up with health NOT_SERVING -> load the engine -> KV sender and
directory publisher -> register in Redis -> SERVING -> the line `pdserve prefill serving on <host:port>` on stdout.
SIGTERM/SIGINT: drain, deregister, drop the pod's prefix directory entries, exit 0.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc.aio

from common.prefix_directory import PrefixDirectory
from common.tls import kv_client_context
from engine.llm_engine import LLMEngine
from kv_transfer.factory import make_pod_sender
from pdserve.v1 import prefill_pb2_grpc
from pod.admission import Admission
from pod.config import PodConfig, parse_pod_config
from pod.run import configure_logging
from pod.run import run_pod as run_any_pod
from pod.runtime import PodRuntime
from pod.worker import PodWorker
from prefill_service.directory_publisher import DirectoryPublisher
from prefill_service.prefill_worker import PrefillWorker
from prefill_service.server import SERVICE_NAME, PrefillServicer


def parse_args(argv: list[str] | None = None) -> PodConfig:
    """The pod's config from its flags (bad values exit with a usage error)."""
    return parse_pod_config("prefill", argv, with_receiver=False)


async def run_pod(config: PodConfig, stop: asyncio.Event | None = None, handle_signals: bool = False) -> int:
    """Serve until `stop` is set (or a signal arrives, with `handle_signals`), then drain; returns the exit code."""
    servicer = PrefillServicer()

    def add_servicer(server: grpc.aio.Server) -> str:
        prefill_pb2_grpc.add_PrefillServiceServicer_to_server(servicer, server)
        return SERVICE_NAME

    @asynccontextmanager
    async def open_worker(engine: LLMEngine, runtime: PodRuntime) -> AsyncIterator[PodWorker]:
        transfer = config.transfer
        # NOTE: a parallel engine gives one view per rank: one sender per rank ships it rank to rank.
        sender = make_pod_sender(
            transfer.kv_transfer_backend,
            engine.kv_pool_views(),
            lease_s=transfer.kv_lease_s,
            connect_timeout_s=transfer.kv_connect_timeout_s,
            ssl_context=kv_client_context(config.tls),
        )
        publisher = DirectoryPublisher(PrefixDirectory(config.registry.redis_url), runtime.pod_id, runtime.generation)
        worker = PrefillWorker(
            engine,
            sender,
            transfer.kv_transfer_backend,
            transfer.kv_lease_s,
            on_kv_events=publisher.offer,
            tracing=runtime.tracing,
            metrics=runtime.metrics,
            admission=Admission(config.admission.limits(engine.scheduler.config)),
            engine_nice=config.server.engine_nice_on(engine.info.device),
        )
        publisher.start()
        worker.start()
        servicer.worker = worker
        try:
            yield worker
        finally:
            await worker.aclose()
            await publisher.aclose()

    return await run_any_pod("prefill", config, add_servicer, open_worker, stop, handle_signals)


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    configure_logging()
    return asyncio.run(run_pod(config, handle_signals=True))


if __name__ == "__main__":
    sys.exit(main())
