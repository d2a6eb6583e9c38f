"""PrefillWorker against a recording KV sender: the chunks it ships, in order, the keepalives of a queued
request, and the abort of a transfer cancelled before its first chunk."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import torch

from common.errors import ResourceExhaustedError
from common.sampling_params import SamplingParams
from engine.llm import engine_config
from engine.llm_engine import LLMEngine
from kv_transfer.base import KVSender, TransferStats, ignore_hook
from kv_transfer.layout import KVLayout
from kv_transfer.state import TransferState, UnknownTransferError
from kv_transfer.target import KVTarget
from pod.admission import Admission, AdmissionLimits
from prefill_service.prefill_events import PrefillEvent, TransferDone
from prefill_service.prefill_worker import PrefillWorker

pytestmark = pytest.mark.anyio

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
Send = tuple[str, list[int], list[int], bool]


class RecordingSender(KVSender):
    """Records every chunk and abort; a last chunk is acknowledged at once (DONE, from another thread)."""

    def __init__(self, pool: torch.Tensor, block_size: int) -> None:
        self.layout = KVLayout.from_pool(pool, block_size)
        self.on_finished = ignore_hook
        self.sends: list[Send] = []
        self.aborts: list[tuple[str, str | None]] = []

    def send(
        self,
        transfer_id: str,
        endpoint: str,
        layout: KVLayout,
        src_block_ids: Sequence[int],
        dst_block_ids: Sequence[int],
        last: bool,
    ) -> None:
        self.sends.append((transfer_id, list(src_block_ids), list(dst_block_ids), last))
        if last:
            threading.Thread(target=self.on_finished, args=(transfer_id, TransferState.DONE)).start()

    def state(self, transfer_id: str) -> TransferState:
        raise UnknownTransferError(transfer_id)

    def wait(self, transfer_id: str, timeout_s: float) -> TransferState:
        return TransferState.DONE

    def abort(self, transfer_id: str, endpoint: str | None = None) -> None:
        self.aborts.append((transfer_id, endpoint))

    def stats(self, transfer_id: str) -> TransferStats:
        num_blocks = sum(len(src) for tid, src, _, _ in self.sends if tid == transfer_id)
        return TransferStats(transfer_id, TransferState.DONE, num_blocks * self.layout.block_nbytes, num_blocks, 0, 0.0)

    def close(self) -> None:
        pass


async def _run(worker: PrefillWorker, prompt: list[int], target: KVTarget) -> list[PrefillEvent]:
    return [event async for event in worker.prefill(prompt, GREEDY, target)]


async def _wait_until_all_blocks_free(worker: PrefillWorker, num_blocks: int) -> None:
    """The DONE hooks queue the frees as engine commands: wait (up to 1 s) until the load shows them."""
    for _ in range(100):
        if worker.load().num_free_blocks == num_blocks:
            break
        await asyncio.sleep(0.01)
    assert worker.load().num_free_blocks == num_blocks


async def test_chunks_in_order_and_keepalives_while_queued(tiny_model: Path) -> None:
    engine = LLMEngine(engine_config(str(tiny_model), num_blocks=64, max_num_seqs=1, long_prefill_token_threshold=16))
    sender = RecordingSender(engine.runner.kv_cache, 16)
    worker = PrefillWorker(engine, sender, "tcp", lease_s=10.0)
    worker.start()
    rng = random.Random(0)
    long_prompt, short_prompt = [rng.randrange(512) for _ in range(600)], [rng.randrange(512) for _ in range(20)]
    try:
        # max_num_seqs=1: the short request waits for the long one's 38 prefill steps, longer than a third of
        # its 0.03 s lease, so it keeps its reservation alive with empty chunks (the long one, computing, needs none).
        long_target = KVTarget("long", "tcp", "127.0.0.1:1", tuple(range(100, 138)), sender.layout, 10.0)
        short_target = KVTarget("short", "tcp", "127.0.0.1:1", (7, 9), sender.layout, 0.03)
        long_events, short_events = await asyncio.gather(
            _run(worker, long_prompt, long_target), _run(worker, short_prompt, short_target)
        )
        assert [type(e) for e in long_events][1:] == [type(e) for e in short_events][1:] == [TransferDone]
        long_sends = [s for s in sender.sends if s[0] == "long"]
        # One block per 16-token step: 37 full ones, then the partial last block (8 tokens) as the last chunk.
        assert [dst for _, _, dst, _ in long_sends] == [[100 + i] for i in range(38)]
        assert [last for *_, last in long_sends] == [False] * 37 + [True]
        assert all(src for _, src, _, _ in long_sends)
        short_sends = [s for s in sender.sends if s[0] == "short"]
        chunks = [(len(src), dst, last) for _, src, dst, last in short_sends if src]
        assert chunks == [(1, [7], False), (1, [9], True)] and short_sends[-1][3]
        keepalives = [s for s in short_sends if not s[1]]
        assert short_sends[0] in keepalives and all(s[1:] == ([], [], False) for s in keepalives)
        # Both transfers are DONE: the held blocks are freed (a command the DONE hooks queue).
        await _wait_until_all_blocks_free(worker, 64)
    finally:
        await worker.aclose()


async def test_transfer_done_before_the_first_token_is_seen(tiny_model: Path) -> None:
    """Async scheduling: the last chunk ships (and its ack can arrive) while the first token is still in flight."""
    engine = LLMEngine(engine_config(str(tiny_model), num_blocks=64, async_scheduling=True))
    sender = RecordingSender(engine.runner.kv_cache, 16)
    worker = PrefillWorker(engine, sender, "tcp", lease_s=10.0)
    worker.start()
    try:
        for index in range(5):
            target = KVTarget(f"t{index}", "tcp", "127.0.0.1:1", (3, 5, 8), sender.layout, 10.0)
            events = await _run(worker, [random.Random(index).randrange(512) for _ in range(40)], target)
            assert [type(e).__name__ for e in events] == ["FirstToken", "TransferDone"]
        await _wait_until_all_blocks_free(worker, 64)
    finally:
        await worker.aclose()


async def test_call_cancelled_before_its_first_chunk_aborts_the_transfer_at_its_endpoint(tiny_model: Path) -> None:
    engine = LLMEngine(engine_config(str(tiny_model), num_blocks=64, max_num_seqs=1, long_prefill_token_threshold=16))
    sender = RecordingSender(engine.runner.kv_cache, 16)
    worker = PrefillWorker(engine, sender, "tcp", lease_s=10.0)
    worker.start()
    rng = random.Random(1)
    long_prompt, short_prompt = [rng.randrange(512) for _ in range(600)], [rng.randrange(512) for _ in range(20)]
    try:
        long_target = KVTarget("long", "tcp", "127.0.0.1:1", tuple(range(100, 138)), sender.layout, 10.0)
        short_target = KVTarget("short", "tcp", "127.0.0.1:2", (7, 9), sender.layout, 10.0)
        long_call = asyncio.create_task(_run(worker, long_prompt, long_target))
        short_call = asyncio.create_task(_run(worker, short_prompt, short_target))
        # max_num_seqs=1: the short request waits behind the long one's 38 prefill steps; it is cancelled there.
        while not sender.sends:
            await asyncio.sleep(0.001)
        short_call.cancel()
        await asyncio.gather(short_call, return_exceptions=True)

        assert not [s for s in sender.sends if s[0] == "short"]
        # The decode pod's receiver must hear of it: its reservation would otherwise wait for its lease.
        assert sender.aborts == [("short", "127.0.0.1:2")]
        assert [type(e).__name__ for e in await long_call] == ["FirstToken", "TransferDone"]
        await _wait_until_all_blocks_free(worker, 64)
    finally:
        await worker.aclose()


@asynccontextmanager
async def _engine_in_a_long_step(worker: PrefillWorker) -> AsyncIterator[None]:
    """The worker's engine thread is inside one long step until the block ends (then the step returns)."""
    step_running, step_done = threading.Event(), threading.Event()

    def long_step(engine: LLMEngine) -> None:
        step_running.set()
        step_done.wait(5.0)

    busy = asyncio.ensure_future(worker._async_engine.call(long_step))
    try:
        assert await asyncio.to_thread(step_running.wait, 5.0)
        yield
    finally:
        step_done.set()
        await busy


async def test_keepalives_start_at_arrival_while_the_engine_is_inside_a_long_step(tiny_model: Path) -> None:
    engine = LLMEngine(engine_config(str(tiny_model), num_blocks=64))
    sender = RecordingSender(engine.runner.kv_cache, 16)
    worker = PrefillWorker(engine, sender, "tcp", lease_s=10.0)
    worker.start()
    try:
        async with _engine_in_a_long_step(worker):
            target = KVTarget("queued", "tcp", "127.0.0.1:1", (7, 9), sender.layout, 0.03)
            prompt = [random.Random(2).randrange(512) for _ in range(20)]
            queued = asyncio.ensure_future(_run(worker, prompt, target))
            await asyncio.sleep(0.2)
            # The engine has not seen the request yet; its reservation is kept alive all the same.
            assert len(sender.sends) >= 3 and all(s == ("queued", [], [], False) for s in sender.sends)
        events = await queued
        assert [type(e).__name__ for e in events] == ["FirstToken", "TransferDone"]
        assert [(len(src), dst, last) for _, src, dst, last in sender.sends if src] == [(2, [7, 9], True)]
    finally:
        await worker.aclose()


async def test_calls_beyond_the_admission_limit_are_refused_with_a_retry_delay(tiny_model: Path) -> None:
    engine = LLMEngine(engine_config(str(tiny_model), num_blocks=64))
    sender = RecordingSender(engine.runner.kv_cache, 16)
    limits = AdmissionLimits(max_waiting_requests=1, max_retry_s=2.5)
    worker = PrefillWorker(engine, sender, "tcp", lease_s=10.0, admission=Admission(limits))
    worker.start()
    try:
        async with _engine_in_a_long_step(worker):
            prompt = [random.Random(3).randrange(512) for _ in range(20)]
            target = KVTarget("a", "tcp", "127.0.0.1:1", (1, 2), sender.layout)
            first = asyncio.create_task(_run(worker, prompt, target))
            await asyncio.sleep(0.05)
            with pytest.raises(ResourceExhaustedError) as refused:
                await _run(worker, prompt, KVTarget("b", "tcp", "127.0.0.1:1", (3, 4), sender.layout))
            assert str(refused.value) == "overloaded: 1 requests waiting (limit 1)"
            assert refused.value.retry_after_s == 2.5
        assert [type(e).__name__ for e in await first] == ["FirstToken", "TransferDone"]
        events = await _run(worker, prompt, KVTarget("c", "tcp", "127.0.0.1:1", (5, 6), sender.layout))
        assert [type(e).__name__ for e in events] == ["FirstToken", "TransferDone"]
    finally:
        await worker.aclose()
