"""A long engine step (an unchunked prefill) must not stop the pod's heartbeat: the registry entry stays, with the
load as of the last step, while the engine thread is busy for many registry TTLs."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cli.redis_server import RedisServer
from common.pod_registry import PodRegistry
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from engine.scheduler_output import EngineOutput
from kv_transfer.target import KVTarget
from pod.config import PodServerConfig, RegistryConfig
from pod.runtime import PodRuntime
from prefill_service.prefill_events import PrefillEvent
from prefill_service.prefill_worker import PrefillWorker
from tests.prefill_service.test_prefill_worker import GREEDY, RecordingSender

pytestmark = pytest.mark.anyio

HEARTBEAT_S = 0.05  # the entry lives 3 periods: 0.15 s


async def test_registry_entry_outlives_a_step_of_many_ttls(tiny_model: Path, redis_server: RedisServer) -> None:
    engine = LLMEngine(engine_config(str(tiny_model), num_blocks=64))
    in_step, release = threading.Event(), threading.Event()
    step = engine.step

    def slow_step() -> list[EngineOutput]:
        in_step.set()
        release.wait(5.0)
        return step()

    engine.step = slow_step  # type: ignore[method-assign]
    sender = RecordingSender(engine.runner.kv_cache, 16)
    worker = PrefillWorker(engine, sender, "tcp", lease_s=10.0)
    registry_config = RegistryConfig(redis_server.url, "prefill-slow", HEARTBEAT_S)
    runtime = PodRuntime("prefill", "tiny", PodServerConfig(), registry_config)
    registry = PodRegistry(redis_server.url)
    worker.start()
    await runtime.start_server([])
    await runtime.go_live(worker)
    target = KVTarget("slow", "tcp", "127.0.0.1:1", (3, 4), sender.layout, 10.0)
    call = asyncio.ensure_future(_drain(worker.prefill(list(range(20)), GREEDY, target)))
    try:
        await asyncio.to_thread(in_step.wait, 5.0)
        # The step holds the engine thread for 10 TTLs; every beat meanwhile reports the load as of the command
        # that added the request (waiting, no blocks yet).
        for _ in range(15):
            await asyncio.sleep(0.1)
            entries = {p.pod_id: p for p in await registry.list_pods()}
            assert "prefill-slow" in entries
            entry = entries["prefill-slow"]
            assert (entry.num_running, entry.num_waiting, entry.num_free_blocks) == (0, 1, 64)
        release.set()
        await asyncio.wait_for(call, 5.0)
    finally:
        release.set()
        await runtime.stop()
        await worker.aclose()
        await runtime.close_telemetry()
        await registry.aclose()


async def _drain(events: AsyncIterator[PrefillEvent]) -> None:
    async for _ in events:
        pass
