"""`python -m decode_service` / `pdserve decode`: a decode pod.

Start order (`pod.run.run_pod`): gRPC server up with health NOT_SERVING -> the engine core process loads the engine
and opens the KV receiver -> register in Redis -> SERVING -> the line `pdserve decode serving on <host:port>` on
stdout. SIGTERM/SIGINT: drain, deregister, the engine core shuts down, exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc.aio

from decode_service.decode_front import DecodeFront
from decode_service.server import SERVICE_NAME, DecodeServicer
from engine.core.client import EngineCoreClient
from pdserve.v1 import decode_pb2_grpc
from pod.admission import Admission
from pod.config import PodConfig, parse_pod_config
from pod.front import PodFront
from pod.run import configure_logging, core_spec
from pod.run import run_pod as run_any_pod
from pod.runtime import PodRuntime

logger = logging.getLogger("decode_service")


def parse_args(argv: list[str] | None = None) -> PodConfig:
    """The pod's config from its flags (bad values exit with a usage error)."""
    return parse_pod_config("decode", argv, with_receiver=True)


async def run_pod(config: PodConfig, stop: asyncio.Event | None = None, handle_signals: bool = False) -> int:
    """Serve until `stop` is set (or a signal arrives, with `handle_signals`), then drain; returns the exit code."""
    servicer = DecodeServicer()

    def add_servicer(server: grpc.aio.Server) -> str:
        decode_pb2_grpc.add_DecodeServiceServicer_to_server(servicer, server)
        return SERVICE_NAME

    @asynccontextmanager
    async def open_front(runtime: PodRuntime) -> AsyncIterator[PodFront]:
        client = EngineCoreClient(core_spec("decode", config))
        try:
            ready = await client.start()
            front = DecodeFront(
                ready,
                config.transfer.kv_transfer_backend,
                config.transfer.kv_lease_s,
                Admission(config.admission.limits(ready.scheduler)),
                generation=runtime.generation,
                tracing=runtime.tracing,
                metrics=runtime.metrics,
            )
            front.bind(client)
            logger.info("KV receiver (%s) on %s", config.transfer.kv_transfer_backend, front.kv_endpoint)
            servicer.front = front
            yield front
        finally:
            await client.close()

    return await run_any_pod("decode", config, add_servicer, open_front, stop, handle_signals)


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    configure_logging()
    return asyncio.run(run_pod(config, handle_signals=True))


if __name__ == "__main__":
    sys.exit(main())
