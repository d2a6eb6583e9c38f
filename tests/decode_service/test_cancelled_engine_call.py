"""The pods cancel AsyncEngine calls (a cancelled Reserve, a heartbeat at shutdown): a call cancelled before the
engine thread ran it runs nothing, and the engine thread lives on."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from engine.async_engine import AsyncEngine
from engine.llm import engine_config
from engine.llm_engine import LLMEngine

pytestmark = pytest.mark.anyio


async def test_a_call_cancelled_before_it_ran_runs_nothing(tiny_model: Path) -> None:
    async_engine = AsyncEngine(LLMEngine(engine_config(str(tiny_model), num_blocks=16)))
    async_engine.start()
    try:
        release = threading.Event()
        busy = asyncio.ensure_future(async_engine.call(lambda engine: release.wait(5.0)))
        reserve = asyncio.ensure_future(async_engine.call(lambda engine: engine.reserve_kv("r", 32)))
        await asyncio.sleep(0.05)
        reserve.cancel()
        await asyncio.sleep(0.05)  # the cancellation reaches the engine-side future through a loop callback
        release.set()
        assert await busy is True
        assert await async_engine.call(lambda engine: engine.kv_cache_manager.num_free_blocks) == 16
    finally:
        async_engine.stop()
