"""`run_pod`: the life of a pod process, one skeleton for both roles.

1. The runtime starts the gRPC server with the role's servicer; health says NOT_SERVING.
2. The engine loads on a worker thread (health checks keep being answered).
3. The role opens its worker over the engine (`open_worker`: KV sender or receiver, publishers, ...) and hands
   it to its servicer.
4. The runtime registers the pod, heartbeats, reports SERVING and prints the serving line.
5. Once `stopping` is set: drain, then the server stops, the role closes its worker, and telemetry is flushed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import grpc.aio

from common.pod_registry import PodRole
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from pod.config import PodConfig
from pod.runtime import PodRuntime
from pod.worker import PodWorker

logger = logging.getLogger(__name__)

OpenWorker = Callable[[LLMEngine, PodRuntime], AbstractAsyncContextManager[PodWorker]]
"""A role's worker over a loaded engine: started and handed to the servicer on entry, closed on exit."""


async def run_pod(
    role: PodRole,
    config: PodConfig,
    add_servicer: Callable[[grpc.aio.Server], str],
    open_worker: OpenWorker,
    stop: asyncio.Event | None = None,
    handle_signals: bool = False,
) -> int:
    """Serve until `stop` is set (or a signal arrives, with `handle_signals`), then drain; returns the exit code.
    `add_servicer` adds the role's servicer to the server and returns its service name."""
    runtime = PodRuntime(
        role, config.engine.model.model, config.server, config.registry, config.telemetry, stop, config.tls
    )
    await runtime.start_server([add_servicer(runtime.server)])
    if handle_signals:
        runtime.install_signal_handlers()
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(runtime.close_telemetry)
        try:
            engine = await load_engine(config.engine)
            worker = await stack.enter_async_context(open_worker(engine, runtime))
            await runtime.go_live(worker)
            await runtime.stopping.wait()
            await runtime.drain(config.server.drain_timeout_s)
        finally:
            await runtime.stop()
    return 0


async def load_engine(config: EngineConfig) -> LLMEngine:
    """Build the engine on a worker thread (the event loop keeps answering health checks meanwhile)."""
    logger.info("loading model %s ...", config.model.model)
    start = time.monotonic()
    engine = await asyncio.to_thread(LLMEngine, config)
    logger.info(
        "model %s loaded in %.1f s: %d KV blocks of %d tokens on %s",
        config.model.model,
        time.monotonic() - start,
        engine.info.num_blocks,
        engine.info.block_size,
        engine.info.device,
    )
    return engine


def configure_logging() -> None:
    """The pods' log format, on stderr (stdout carries the serving line)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
