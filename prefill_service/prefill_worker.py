"""PrefillWorker: the prefill role's request path, over an engine thread and a KV sender.

Lifecycle of one Prefill call (the engine request id is the transfer id, unique per decode reservation):
1. the request and its KV target are checked against this pod (input, backend, layout, number of blocks);
2. the request is added with `hold_kv=True` and max_tokens forced to 1 (the rest of its sampling params
   unchanged); the KVShipper ships its blocks to the decode pod as the engine computes them (the on_step hook)
   and keeps the reservation alive while it waits (see prefill_service.kv_shipper);
3. the first sampled token is reported at once (FirstToken) while the transfer goes on;
4. the sender's on_finished hook (DONE, FAILED, ABORTED or EXPIRED) frees the held blocks on the engine thread
   and ends the call: TransferDone after DONE, the transfer's TransferError otherwise.
If the first token already ends the request, the transfer is aborted and the call ends after FirstToken.
Cancelling the call aborts the engine request and the transfer; every path frees the blocks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing

from common.errors import InvalidArgumentError, UnavailableError
from common.pod_runtime import PodLoad, engine_stream, read_load
from engine.async_engine import AsyncEngine
from engine.kv_cache_events import KVCacheEvent
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.scheduler_output import EngineOutput
from kv_transfer.base import KVSender
from kv_transfer.state import TransferError, TransferState, UnknownTransferError
from prefill_service.kv_shipper import KEEPALIVES_PER_LEASE, KVShipper, Shipment
from prefill_service.prefill_events import FirstToken, KVTarget, PrefillEvent, TransferDone

logger = logging.getLogger(__name__)

KVEventSink = Callable[[Sequence[KVCacheEvent]], None]

_KEEPALIVE_TICK_S = 0.02


class PrefillWorker:
    """Runs Prefill calls on one engine. Build it, `start()` it on the event loop, `aclose()` it at the end."""

    def __init__(
        self,
        engine: LLMEngine,
        sender: KVSender,
        backend: str,
        lease_s: float,
        on_kv_events: KVEventSink | None = None,
    ) -> None:
        """`lease_s` is the decode pods' reservation lease assumed when a KV target does not name its own."""
        self.info = engine.info
        self._lease_s = lease_s
        self._cache_salt = engine.config.cache.cache_salt
        self._sender = sender
        self._backend = backend
        self._on_kv_events = on_kv_events
        self._async_engine = AsyncEngine(engine, on_step=self._on_step)
        sender.on_finished = self._on_transfer_finished
        self._shipper = KVShipper(sender, engine.info.block_size, on_failed=self._end_transfer)
        self._transfer_ends: dict[str, asyncio.Future[TransferError | None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._keepalive_task: asyncio.Task[None] | None = None
        self._draining = False

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._async_engine.start()
        self._keepalive_task = asyncio.create_task(self._keep_alive(), name="kv-keepalive")

    async def aclose(self) -> None:
        """Abort live transfers (their blocks are freed), then stop the engine thread."""
        if self._keepalive_task is not None:
            self._keepalive_task.cancel()
            await asyncio.gather(self._keepalive_task, return_exceptions=True)
        await asyncio.to_thread(self._sender.close)
        await asyncio.to_thread(self._async_engine.stop)

    @property
    def num_in_flight(self) -> int:
        return len(self._transfer_ends)

    def start_draining(self) -> None:
        self._draining = True

    async def load(self) -> PodLoad:
        return await self._async_engine.call(read_load)

    async def prefill(
        self, prompt_token_ids: list[int], params: SamplingParams, target: KVTarget, cache_salt: str | None = None
    ) -> AsyncIterator[PrefillEvent]:
        """Run one Prefill call: yields FirstToken, then (unless it ended the request) TransferDone.

        Raises InvalidArgumentError for bad input, LayoutMismatchError for a foreign KV layout, UnavailableError
        while draining, and the transfer's TransferError if it ends without DONE.
        """
        if self._draining:
            raise UnavailableError("prefill pod is draining")
        self._check(prompt_token_ids, params, target, cache_salt)
        arrival = time.monotonic()
        req_id = target.transfer_id
        assert self._loop is not None, "start() first"
        ended: asyncio.Future[TransferError | None] = self._loop.create_future()
        self._transfer_ends[req_id] = ended
        # NOTE: keepalives well within the lease, which started at Reserve, a little before this call arrived.
        keepalive_s = (target.lease_s or self._lease_s) / KEEPALIVES_PER_LEASE
        shipment = Shipment(target, len(prompt_token_ids), keepalive_s, last_sent_at=arrival)
        first_params = dataclasses.replace(params, max_tokens=1)
        try:
            first = await self._first_token(req_id, shipment, prompt_token_ids, first_params, params, arrival)
            if first is None:
                # NOTE: a transfer's end resolves `ended` before its abort reaches the request's stream.
                raise (ended.result() if ended.done() else None) or TransferError(
                    f"request {req_id!r} was aborted before its first token"
                )
            yield first
            if first.finish_reason is not None:
                return  # no decode follows: the transfer is aborted below
            error = await ended
            if error is not None:
                raise error
            stats = self._sender.stats(req_id)
            yield TransferDone(stats.num_blocks, stats.num_bytes, stats.duration_s)
        finally:
            del self._transfer_ends[req_id]
            if not ended.done():
                self._shipper.forget(req_id)

    async def _first_token(
        self,
        req_id: str,
        shipment: Shipment,
        prompt_token_ids: list[int],
        first_params: SamplingParams,
        params: SamplingParams,
        arrival: float,
    ) -> FirstToken | None:
        """Add the request and wait for its token; None if it was aborted (its transfer ended first)."""

        def add(engine: LLMEngine) -> None:
            engine.add_request(req_id, prompt_token_ids, first_params, hold_kv=True)
            self._shipper.add(req_id, shipment)

        async with aclosing(engine_stream(self._async_engine, req_id, add)) as outputs:
            async for output in outputs:
                if output.new_token_ids:
                    return self._to_first_token(output, params, time.monotonic() - arrival)
        return None

    def _to_first_token(self, output: EngineOutput, params: SamplingParams, duration_s: float) -> FirstToken:
        stopped = output.finish_reason == "stop"
        ends = stopped or params.max_tokens == 1 or output.num_prompt_tokens + 1 >= self.info.max_model_len
        return FirstToken(
            token_id=output.new_token_ids[0],
            logprob=output.new_logprobs[0] if params.logprobs else None,
            num_cached_tokens=output.num_cached_tokens,
            prefill_duration_s=duration_s,
            finish_reason=("stop" if stopped else "length") if ends else None,
            stop_reason=output.stop_reason if stopped else None,
        )

    def _check(
        self, prompt_token_ids: list[int], params: SamplingParams, target: KVTarget, cache_salt: str | None
    ) -> None:
        # NOTE: validate() only reads the engine's immutable RuntimeInfo: safe off the engine thread.
        self._async_engine.engine.validate(prompt_token_ids, params)
        if cache_salt is not None and cache_salt != self._cache_salt:
            raise InvalidArgumentError(
                "cache_salt",
                "per-request cache salts are not supported: this pod's prefix "
                "cache uses the salt fixed by its --cache-salt",
            )
        if target.backend != self._backend:
            raise InvalidArgumentError(
                "kv_target.backend", f"this pod sends over {self._backend!r}, not {target.backend!r}"
            )
        self._sender.layout.check_compatible(target.layout)
        num_blocks = -(-len(prompt_token_ids) // self.info.block_size)
        if len(target.block_ids) != num_blocks:
            raise InvalidArgumentError(
                "kv_target.block_ids",
                f"{len(target.block_ids)} block ids for {len(prompt_token_ids)} prompt tokens; expected {num_blocks}",
            )
        if not target.transfer_id or target.transfer_id in self._transfer_ends or self._sender_knows(target):
            raise InvalidArgumentError("kv_target.transfer_id", f"{target.transfer_id!r} is empty or already used")

    def _sender_knows(self, target: KVTarget) -> bool:
        try:
            self._sender.state(target.transfer_id)
        except UnknownTransferError:
            return False
        return True

    def _on_step(self, engine: LLMEngine, outputs: list[EngineOutput]) -> None:
        """Engine thread, after every step: hand over cache events, ship newly computed blocks."""
        events = engine.kv_cache_manager.take_events()
        if events and self._on_kv_events is not None:
            self._on_kv_events(events)
        self._shipper.ship_ready(engine)

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(_KEEPALIVE_TICK_S)
            self._shipper.keep_alive()

    def _on_transfer_finished(self, transfer_id: str, state: TransferState) -> None:
        """Sender housekeeping thread: the transfer ended; free the held blocks and end the call."""
        error = None if state is TransferState.DONE else self._transfer_error(transfer_id, state)
        self._end_transfer(transfer_id, error)

    def _end_transfer(self, req_id: str, error: TransferError | None) -> None:
        """Any thread: end the call's wait and free the request's blocks.

        NOTE: abort_requests releases the held blocks of a finished request, and aborts a running one (its stream
        then ends with finish_reason "abort"), so one command covers every moment a transfer can end.
        """
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._resolve, req_id, error)
        self._async_engine.abort(req_id)

    def _resolve(self, req_id: str, error: TransferError | None) -> None:
        ended = self._transfer_ends.get(req_id)
        if ended is not None and not ended.done():
            ended.set_result(error)

    def _transfer_error(self, transfer_id: str, state: TransferState) -> TransferError:
        error = self._sender.stats(transfer_id).error
        return error or TransferError(f"KV transfer {transfer_id!r} ended {state.value}")
