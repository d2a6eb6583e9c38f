"""`run_pod`: the life of a pod process, one skeleton for both roles.

1. The runtime starts the gRPC server with the role's servicer; health says NOT_SERVING.
2. The role opens its front (`open_front`): it starts the engine core process (`engine.core`), which loads the
   engine and opens the role's KV transfer end beside the pool (health checks keep being answered meanwhile), and
   hands the front to its servicer.
3. The runtime registers the pod, heartbeats, reports SERVING and prints the serving line.
4. Once `stopping` is set: drain, then the server stops, the role closes its front (the engine core shuts down),
   and telemetry is flushed. If the engine core dies first (its process exited, a step failed, a worker process of
   a tensor-parallel pod died), the pod reports NOT_SERVING, deregisters at once (its in-flight requests have
   failed and migrate through the router) and exits with 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sys
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import grpc.aio

from common.pod_registry import PodRole
from engine.core.messages import CoreSpec
from pod.config import KVReceiverConfig, PodConfig
from pod.front import PodFront
from pod.runtime import PodRuntime

logger = logging.getLogger(__name__)

_ENGINE_CHECK_S = 0.2

OpenFront = Callable[[PodRuntime], AbstractAsyncContextManager[PodFront]]
"""A role's front over its engine core: started (the engine loaded) and handed to the servicer on entry, closed on
exit."""


async def run_pod(
    role: PodRole,
    config: PodConfig,
    add_servicer: Callable[[grpc.aio.Server], str],
    open_front: OpenFront,
    stop: asyncio.Event | None = None,
    handle_signals: bool = False,
) -> int:
    """Serve until `stop` is set (or a signal arrives, with `handle_signals`), then drain; returns the exit code.
    `add_servicer` adds the role's servicer to the server and returns its service name."""
    runtime = PodRuntime(
        role,
        config.engine.model.model,
        config.server,
        config.registry,
        config.telemetry,
        stop,
        config.tls,
        config.engine.parallel,
    )
    await runtime.start_server([add_servicer(runtime.server)])
    if handle_signals:
        runtime.install_signal_handlers()
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(runtime.close_telemetry)
        try:
            front = await stack.enter_async_context(open_front(runtime))
            await runtime.go_live(front)
            failed = await _serve_until_stopping(runtime, front)
            await runtime.drain(0.0 if failed else config.server.drain_timeout_s)
        finally:
            await runtime.stop()
    return 1 if failed else 0


async def _serve_until_stopping(runtime: PodRuntime, front: PodFront) -> bool:
    """Wait for `runtime.stopping`; True if the engine failed first."""
    while not runtime.stopping.is_set():
        if front.engine_failed:
            logger.error("%s %s: the engine failed; leaving routing and exiting", runtime.role, runtime.pod_id)
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(runtime.stopping.wait(), _ENGINE_CHECK_S)
    return False


def core_spec(role: PodRole, config: PodConfig) -> CoreSpec:
    """What the role's engine core process needs of the pod's config. A prefill pod's engine never speculates (it
    samples one token per request): it drops `speculative_config`, which would load a draft model for nothing."""
    receiver = config.receiver or KVReceiverConfig()
    engine = config.engine if role != "prefill" else dataclasses.replace(config.engine, speculative_config=None)
    return CoreSpec(
        role=role,
        engine=engine,
        kv_transfer_backend=config.transfer.kv_transfer_backend,
        tls=config.tls,
        kv_lease_s=config.transfer.kv_lease_s,
        kv_connect_timeout_s=config.transfer.kv_connect_timeout_s,
        kv_host=config.server.host,
        kv_port=receiver.kv_port,
        kv_advertise_host=config.server.public_host,
    )


def configure_logging() -> None:
    """The pods' log format, on stderr (stdout carries the serving line)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
