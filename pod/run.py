"""`run_pod`: the life of a pod process, one skeleton for both roles.

1. The runtime starts the gRPC server with the role's servicer; health says NOT_SERVING.
2. The engine loads on a worker thread (health checks keep being answered).
3. The role opens its worker over the engine (`open_worker`: KV sender or receiver, publishers, ...) and hands
   it to its servicer.
4. The runtime registers the pod, heartbeats, reports SERVING and prints the serving line.
5. Once `stopping` is set: drain, then the server stops, the role closes its worker, and telemetry is flushed.
   If the engine fails first (e.g. a worker process of a tensor-parallel pod died), the pod reports NOT_SERVING,
   deregisters at once (its in-flight requests have failed and migrate through the router) and exits with 1.
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

_ENGINE_CHECK_S = 0.2

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
        role, config.engine.model.model, config.server, config.registry, config.telemetry, stop, config.tls,
        config.engine.parallel,
    )  # fmt: skip
    await runtime.start_server([add_servicer(runtime.server)])
    if handle_signals:
        runtime.install_signal_handlers()
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(runtime.close_telemetry)
        try:
            engine = await load_engine(config.engine)
            worker = await stack.enter_async_context(open_worker(engine, runtime))
            await runtime.go_live(worker)
            failed = await _serve_until_stopping(runtime, worker)
            await runtime.drain(0.0 if failed else config.server.drain_timeout_s)
        finally:
            await runtime.stop()
    return 1 if failed else 0


async def _serve_until_stopping(runtime: PodRuntime, worker: PodWorker) -> bool:
    """Wait for `runtime.stopping`; True if the engine failed first."""
    while not runtime.stopping.is_set():
        if worker.engine_failed:
            logger.error("%s %s: the engine failed; leaving routing and exiting", runtime.role, runtime.pod_id)
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(runtime.stopping.wait(), _ENGINE_CHECK_S)
    return False


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
