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
Telemetry: a "prefill" span (arrival to first token) with a "prefill.chunk" child per engine step that computed
part of the prompt (see prefill_service.chunk_spans), and a "kv_transfer" span (arrival to the transfer's end);
a transfer that ends without DONE, and a call that ends early, are logged.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing

from opentelemetry import context as otel_context
from opentelemetry import trace

from common.errors import InvalidArgumentError, UnavailableError
from common.kv_cache_events import KVCacheEvent
from common.metrics import ServiceMetrics
from common.sampling_params import SamplingParams
from common.telemetry import (
    EVENT_FIRST_TOKEN,
    EVENT_KV_TRANSFER_DONE,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_USAGE_INPUT_TOKENS,
    PDSERVE_KV_TRANSFER_BACKEND,
    PDSERVE_KV_TRANSFER_BYTES,
    PDSERVE_KV_TRANSFER_DURATION_S,
    PDSERVE_KV_TRANSFER_ID,
    PDSERVE_REQUEST_ID,
    Attributes,
    Tracing,
    add_event,
    capture_context,
    set_attributes,
)
from engine.async_engine import AsyncEngine
from engine.llm_engine import LLMEngine
from engine.scheduler_output import EngineOutput
from kv_transfer.base import KVSender
from kv_transfer.state import TransferError, TransferState, UnknownTransferError
from kv_transfer.target import KVTarget
from pod.worker import PodLoad, read_load, report_engine_state
from prefill_service.chunk_spans import ChunkSpans
from prefill_service.kv_shipper import KEEPALIVES_PER_LEASE, KVShipper, Shipment
from prefill_service.prefill_events import FirstToken, PrefillEvent, TransferDone

logger = logging.getLogger(__name__)

KVEventSink = Callable[[Sequence[KVCacheEvent]], None]

_KEEPALIVE_TICK_S = 0.02
PDSERVE_QUEUE_TIME_S = "pdserve.prefill.queue_time_s"
PDSERVE_NUM_CACHED_TOKENS = "pdserve.prefill.num_cached_tokens"


class PrefillWorker:
    """Runs Prefill calls on one engine. Build it, `start()` it on the event loop, `aclose()` it at the end."""

    def __init__(
        self,
        engine: LLMEngine,
        sender: KVSender,
        backend: str,
        lease_s: float,
        on_kv_events: KVEventSink | None = None,
        tracing: Tracing | None = None,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        """`lease_s` is the decode pods' reservation lease assumed when a KV target does not name its own."""
        self.info = engine.info
        self._lease_s = lease_s
        self._cache_salt = engine.config.cache.cache_salt
        self._sender = sender
        self._backend = backend
        self._on_kv_events = on_kv_events
        self._tracing = tracing or Tracing(trace.NoOpTracer())
        self._metrics = metrics or ServiceMetrics("prefill")
        self._chunk_spans = ChunkSpans(self._tracing.tracer)
        self._load = read_load(engine)
        self._async_engine = AsyncEngine(engine, on_step=self._on_step, on_update=self._on_update)
        sender.on_finished = self._on_transfer_finished
        self._shipper = KVShipper(sender, engine.info.block_size, on_failed=self._on_ship_failed)
        self._transfer_ends: dict[str, asyncio.Future[TransferError | None]] = {}
        self._request_ids: dict[str, str] = {}
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

    def load(self) -> PodLoad:
        """The engine's load after its last step or command (see pod.worker.PodWorker)."""
        return self._load

    @property
    def kv_endpoint(self) -> str:
        """Empty: a prefill pod sends KV and receives none."""
        return ""

    async def prefill(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        target: KVTarget,
        cache_salt: str | None = None,
        request_id: str = "",
    ) -> AsyncIterator[PrefillEvent]:
        """Run one Prefill call: yields FirstToken, then (unless it ended the request) TransferDone.

        Raises InvalidArgumentError for bad input, LayoutMismatchError for a foreign KV layout, UnavailableError
        while draining, and the transfer's TransferError if it ends without DONE. `request_id` (the router's) is
        only for logs and spans.
        """
        if self._draining:
            raise UnavailableError("prefill pod is draining")
        self._check(prompt_token_ids, params, target, cache_salt)
        arrival, arrival_ns = time.monotonic(), time.time_ns()
        req_id = target.transfer_id
        assert self._loop is not None, "start() first"
        ended: asyncio.Future[TransferError | None] = self._loop.create_future()
        self._transfer_ends[req_id] = ended
        self._request_ids[req_id] = request_id
        # NOTE: keepalives well within the lease, which started at Reserve, a little before this call arrived.
        keepalive_s = (target.lease_s or self._lease_s) / KEEPALIVES_PER_LEASE
        shipment = Shipment(target, len(prompt_token_ids), keepalive_s, last_sent_at=arrival)
        first_params = dataclasses.replace(params, max_tokens=1)
        transfer_span = self._tracing.tracer.start_span(
            "kv_transfer",
            attributes={PDSERVE_KV_TRANSFER_ID: req_id, PDSERVE_KV_TRANSFER_BACKEND: self._backend},
            start_time=arrival_ns,
        )
        finished = False
        first: FirstToken | None = None
        try:
            first = await self._traced_first_token(
                request_id, req_id, shipment, prompt_token_ids, first_params, params, (arrival, arrival_ns)
            )
            if first is None:
                # NOTE: a transfer's end resolves `ended` before its abort reaches the request's stream.
                raise (ended.result() if ended.done() else None) or TransferError(
                    f"request {req_id!r} was aborted before its first token"
                )
            yield first
            if first.finish_reason is not None:
                finished = True
                return  # no decode follows: the transfer is aborted below
            error = await ended
            if error is not None:
                raise error
            stats = self._sender.stats(req_id)
            transfer_span.set_attributes(
                {PDSERVE_KV_TRANSFER_BYTES: stats.num_bytes, PDSERVE_KV_TRANSFER_DURATION_S: stats.duration_s}
            )
            transfer_span.add_event(EVENT_KV_TRANSFER_DONE, {"num_blocks": stats.num_blocks})
            finished = True
            yield TransferDone(stats.num_blocks, stats.num_bytes, stats.duration_s)
        finally:
            del self._transfer_ends[req_id]
            del self._request_ids[req_id]
            self._chunk_spans.pop_first_scheduled_ns(req_id)
            if not ended.done():
                self._shipper.forget(req_id, target.endpoint)
            if not finished:
                state = "failed" if ended.done() and ended.result() is not None else "aborted"
                logger.info("prefill of request %r (transfer %s) ended early: %s", request_id, req_id, state)
            if first is None:
                self._metrics.observe_finished("abort", time.monotonic() - arrival, 0)
            transfer_span.end()

    async def _traced_first_token(
        self,
        request_id: str,
        req_id: str,
        shipment: Shipment,
        prompt_token_ids: list[int],
        first_params: SamplingParams,
        params: SamplingParams,
        arrival: tuple[float, int],
    ) -> FirstToken | None:
        """`_first_token` inside the "prefill" span, with the prefill pod's metrics of a first token; `arrival` is
        (time.monotonic(), time.time_ns())."""
        attributes: Attributes = {
            PDSERVE_REQUEST_ID: request_id,
            PDSERVE_KV_TRANSFER_ID: req_id,
            GEN_AI_REQUEST_MODEL: self.info.model_id,
            GEN_AI_USAGE_INPUT_TOKENS: len(prompt_token_ids),
        }
        with self._tracing.span("prefill", attributes):
            first = await self._first_token(
                req_id, shipment, prompt_token_ids, first_params, params, arrival[0], capture_context()
            )
            if first is None:
                return None
            first_scheduled_ns = self._chunk_spans.pop_first_scheduled_ns(req_id)
            ttft = first.prefill_duration_s
            queue_s = None if first_scheduled_ns is None else max(0.0, (first_scheduled_ns - arrival[1]) / 1e9)
            set_attributes({PDSERVE_QUEUE_TIME_S: queue_s, PDSERVE_NUM_CACHED_TOKENS: first.num_cached_tokens})
            add_event(EVENT_FIRST_TOKEN, {"token_id": first.token_id})
        self._metrics.observe_first_token(ttft, len(prompt_token_ids))
        prefill_s = None if queue_s is None else ttft - queue_s
        # NOTE: the engine request ends here, after one token ("length": max_tokens is 1), whatever follows.
        reason = first.finish_reason or "length"
        self._metrics.observe_finished(reason, ttft, 1, queue_s=queue_s, prefill_s=prefill_s)
        return first

    async def _first_token(
        self,
        req_id: str,
        shipment: Shipment,
        prompt_token_ids: list[int],
        first_params: SamplingParams,
        params: SamplingParams,
        arrival: float,
        trace_context: otel_context.Context,
    ) -> FirstToken | None:
        """Add the request and wait for its token; None if it was aborted (its transfer ended first)."""

        def add(engine: LLMEngine) -> None:
            engine.add_request(req_id, prompt_token_ids, first_params, hold_kv=True)
            self._shipper.add(req_id, shipment)
            self._chunk_spans.track(req_id, len(prompt_token_ids), trace_context)

        async with aclosing(self._async_engine.generate(req_id, add)) as outputs:
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
        """Engine thread, after every step: hand over cache events, ship newly computed blocks, chunk spans."""
        events = engine.kv_cache_manager.take_events()
        if events and self._on_kv_events is not None:
            self._on_kv_events(events)
        self._shipper.ship_ready(engine)
        self._chunk_spans.on_step(engine, self._async_engine.step_started_ns)

    def _on_update(self, engine: LLMEngine) -> None:
        """Engine thread, after every step and command: the load snapshot and the metrics' engine state."""
        self._load = report_engine_state(self._metrics, engine)

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(_KEEPALIVE_TICK_S)
            self._shipper.keep_alive()

    def _on_transfer_finished(self, transfer_id: str, state: TransferState) -> None:
        """Sender housekeeping thread: the transfer ended; count and log it, free the held blocks, end the call."""
        if state is TransferState.DONE:
            stats = self._sender.stats(transfer_id)
            self._metrics.observe_kv_transfer(self._backend, stats.num_bytes, stats.duration_s)
            # NOTE: released, not aborted: under async scheduling the last chunk can be acked while the first token
            # is still in flight; the request finishes with it, then its blocks are freed.
            self._end_transfer(transfer_id, None, self._async_engine.release_kv)
            return
        error = self._transfer_error(transfer_id, state)
        if state is TransferState.EXPIRED:
            self._metrics.count_kv_lease_expiry()
        elif state is TransferState.FAILED:
            self._metrics.count_kv_transfer_failure(self._backend)
        request_id = self._request_ids.get(transfer_id)
        # NOTE: a transfer aborted after its call ended is this pod's own doing (a cancel, or no decode follows).
        log = logger.warning if request_id is not None else logger.debug
        log("KV transfer %s of request %r ended %s: %s", transfer_id, request_id, state.value, error)
        self._end_transfer(transfer_id, error)

    def _on_ship_failed(self, req_id: str, error: TransferError) -> None:
        """Engine or keepalive thread (the shipper's lock held): sending a chunk failed."""
        self._metrics.count_kv_transfer_failure(self._backend)
        logger.warning("KV transfer %s of request %r failed: %s", req_id, self._request_ids.get(req_id, ""), error)
        self._end_transfer(req_id, error)

    def _end_transfer(
        self, req_id: str, error: TransferError | None, free: Callable[[str], None] | None = None
    ) -> None:
        """Any thread: end the call's wait and free the request's blocks with `free` (default: abort).

        NOTE: abort_requests releases the held blocks of a finished request, and aborts a running one (its stream
        then ends with finish_reason "abort"), so one command covers every moment a failed transfer can end.
        """
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._resolve, req_id, error)
        (free or self._async_engine.abort)(req_id)

    def _resolve(self, req_id: str, error: TransferError | None) -> None:
        ended = self._transfer_ends.get(req_id)
        if ended is not None and not ended.done():
            ended.set_result(error)

    def _transfer_error(self, transfer_id: str, state: TransferState) -> TransferError:
        error = self._sender.stats(transfer_id).error
        return error or TransferError(f"KV transfer {transfer_id!r} ended {state.value}")
