"""DecodeWorker's Reserve under load and cancellation (in-process receiver): the admission limit answers
RESOURCE_EXHAUSTED with a retry delay, and a Reserve cancelled while its engine command runs frees its blocks at once,
not when its lease lapses."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from common.errors import ResourceExhaustedError
from decode_service.decode_worker import DecodeWorker
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from kv_transfer.in_process import InProcessReceiver
from pod.admission import Admission, AdmissionLimits

pytestmark = pytest.mark.anyio

NUM_BLOCKS = 32
LEASE_S = 30.0


@asynccontextmanager
async def _worker(tiny_model: Path, limits: AdmissionLimits) -> AsyncIterator[DecodeWorker]:
    engine = LLMEngine(engine_config(str(tiny_model), num_blocks=NUM_BLOCKS))
    receiver = InProcessReceiver(engine.runner.kv_cache, 16)
    worker = DecodeWorker(engine, receiver, "inproc", LEASE_S, admission=Admission(limits))
    worker.start()
    try:
        yield worker
    finally:
        await worker.aclose()


async def _num_free_blocks(worker: DecodeWorker) -> int:
    return await worker._async_engine.call(lambda engine: engine.kv_cache_manager.num_free_blocks)


async def test_reservations_beyond_the_limit_are_refused_until_one_ends(tiny_model: Path) -> None:
    async with _worker(tiny_model, AdmissionLimits(max_waiting_requests=2, max_retry_s=1.5)) as worker:
        first = await worker.reserve(40, 4, "a")
        await worker.reserve(40, 4, "b")
        with pytest.raises(ResourceExhaustedError) as refused:
            await worker.reserve(40, 4, "c")
        assert str(refused.value) == "overloaded: 2 requests waiting (limit 2)"
        assert refused.value.retry_after_s == 1.5
        assert await _num_free_blocks(worker) == NUM_BLOCKS - 6
        worker.release(first.transfer_id)
        third = await worker.reserve(40, 4, "c")
        assert len(third.block_ids) == 3


async def test_a_reserve_cancelled_while_its_command_runs_frees_the_blocks_at_once(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _worker(tiny_model, AdmissionLimits()) as worker:
        running, release = threading.Event(), threading.Event()
        reserve_and_lease = worker._reserve_and_lease

        def slow_reserve_and_lease(engine: LLMEngine, transfer_id: str, num_prompt_tokens: int) -> list[int] | None:
            running.set()
            release.wait(5.0)
            return reserve_and_lease(engine, transfer_id, num_prompt_tokens)

        monkeypatch.setattr(worker, "_reserve_and_lease", slow_reserve_and_lease)
        reserve = asyncio.ensure_future(worker.reserve(40, 4, "cancelled"))
        assert await asyncio.to_thread(running.wait, 5.0)
        reserve.cancel()  # the command already runs: it reserves 3 blocks under a 30 s lease all the same
        with pytest.raises(asyncio.CancelledError):
            await reserve
        release.set()
        for _ in range(100):
            if await _num_free_blocks(worker) == NUM_BLOCKS:
                break
            await asyncio.sleep(0.01)
        assert await _num_free_blocks(worker) == NUM_BLOCKS
        assert worker.num_in_flight == 0
