"""`python -m prefill_service` / `pdserve prefill`: a prefill pod.

Start order (`pod.run.run_pod`): gRPC server up with health NOT_SERVING -> the engine core process loads the engine
and opens the KV sender -> directory publisher -> register in Redis -> SERVING -> the line `pdserve prefill serving
on <host:port>` on stdout. SIGTERM/SIGINT: drain, deregister, the engine core shuts down, drop the pod's prefix
directory entries, exit 0.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc.aio

from common.prefix_directory import PrefixDirectory
from engine.core.client import EngineCoreClient
from pdserve.v1 import prefill_pb2_grpc
from pod.admission import Admission
from pod.config import PodConfig, parse_pod_config
from pod.front import PodFront
from pod.run import configure_logging, core_spec
from pod.run import run_pod as run_any_pod
from pod.runtime import PodRuntime
from prefill_service.directory_publisher import DirectoryPublisher
from prefill_service.prefill_front import PrefillFront
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
    async def open_front(runtime: PodRuntime) -> AsyncIterator[PodFront]:
        client = EngineCoreClient(core_spec("prefill", config))
        publisher = DirectoryPublisher(PrefixDirectory(config.registry.redis_url), runtime.pod_id, runtime.generation)
        try:
            ready = await client.start()
            front = PrefillFront(
                ready,
                config.transfer.kv_transfer_backend,
                config.transfer.kv_lease_s,
                Admission(config.admission.limits(ready.scheduler)),
                on_kv_events=publisher.offer,
                tracing=runtime.tracing,
                metrics=runtime.metrics,
            )
            publisher.start()
            front.bind(client)
            servicer.front = front
            yield front
        finally:
            await client.close()
            await publisher.aclose()

    return await run_any_pod("prefill", config, add_servicer, open_front, stop, handle_signals)


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    configure_logging()
    return asyncio.run(run_pod(config, handle_signals=True))


if __name__ == "__main__":
    sys.exit(main())
