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

from common.errors import UnavailableError
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
from kv_transfer.state import TransferError
from kv_transfer.target import KVTarget
from pod.admission import Admission, AdmissionLimits
from pod.worker import PodLoad, read_load, report_engine_state
from prefill_service.chunk_spans import ChunkSpans
from prefill_service.kv_shipper import KEEPALIVES_PER_LEASE, KVShipper, Shipment
from prefill_service.prefill_checks import PrefillChecks
from prefill_service.prefill_events import FirstToken, PrefillEvent, TransferDone
from prefill_service.transfer_ends import TransferEnd, TransferEnds

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
        admission: Admission | None = None,
        engine_nice: int = 0,
    ) -> None:
        """`lease_s` is the decode pods' reservation lease assumed when a KV target does not name its own;
        `admission` limits the calls waiting for their first token (default: no limit); `engine_nice`: AsyncEngine's."""
        self.info = engine.info
        self._lease_s = lease_s
        self._sender = sender
        self._backend = backend
        self._on_kv_events = on_kv_events
        self._tracing = tracing or Tracing(trace.NoOpTracer())
        self._metrics = metrics or ServiceMetrics("prefill")
        self._chunk_spans = ChunkSpans(self._tracing.tracer)
        self._load = read_load(engine)
        self._async_engine = AsyncEngine(engine, on_step=self._on_step, on_update=self._on_update, nice=engine_nice)
        self._checks = PrefillChecks(engine, sender, backend)
        self._transfer_ends = TransferEnds(sender, backend, self._metrics, self._async_engine)
        sender.on_finished = self._transfer_ends.on_transfer_finished
        self._shipper = KVShipper(sender, engine.info.block_size, on_failed=self._transfer_ends.on_ship_failed)
        self._admission = admission or Admission(AdmissionLimits())
        self._keepalive_task: asyncio.Task[None] | None = None
        self._draining = False

    def start(self) -> None:
        self._transfer_ends.start()
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

    @property
    def engine_failed(self) -> bool:
        return self._async_engine.failed

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
        while draining, ResourceExhaustedError beyond the admission limits, and the transfer's TransferError if it
        ends without DONE. `request_id` (the router's) is only for logs and spans.
        """
        if self._draining:
            raise UnavailableError("prefill pod is draining")
        self._checks.check(prompt_token_ids, params, target, self._transfer_ends)
        ticket = self._admission.admit("", len(prompt_token_ids))
        arrival, arrival_ns = time.monotonic(), time.time_ns()
        transfer_id = target.transfer_id
        ended, transfer_span = self._open(target, request_id, len(prompt_token_ids), (arrival, arrival_ns))
        first_params = dataclasses.replace(params, max_tokens=1)
        finished = False
        first: FirstToken | None = None
        try:
            first = await self._traced_first_token(
                request_id, transfer_id, prompt_token_ids, first_params, params, cache_salt, (arrival, arrival_ns)
            )
            self._admission.start(ticket)
            if first is None:
                # NOTE: a transfer's end resolves `ended` before its abort reaches the request's stream.
                raise (ended.result() if ended.done() else None) or TransferError(
                    f"request {transfer_id!r} was aborted before its first token"
                )
            yield first
            if first.finish_reason is not None:
                finished = True
                return  # no decode follows: the transfer is aborted below
            done = await self._transfer_done(transfer_id, ended, transfer_span)
            finished = True
            yield done
        finally:
            self._admission.finish(ticket)
            self._close(target, request_id, ended, finished, first is None, arrival)
            transfer_span.end()

    def _open(
        self, target: KVTarget, request_id: str, num_prompt_tokens: int, arrival: tuple[float, int]
    ) -> tuple[TransferEnd, trace.Span]:
        """A call arrived (`arrival`: time.monotonic(), time.time_ns()): its transfer's end to wait for, its shipment
        (keepalives started), and its "kv_transfer" span."""
        ended = self._transfer_ends.open(target.transfer_id, request_id)
        # NOTE: keepalives well within the lease, which started at Reserve, a little before this call arrived; they
        # start now, not when the engine takes the request up, so that a long queue lets no reservation lapse.
        keepalive_s = (target.lease_s or self._lease_s) / KEEPALIVES_PER_LEASE
        self._shipper.add(target.transfer_id, Shipment(target, num_prompt_tokens, keepalive_s, last_sent_at=arrival[0]))
        attributes = {PDSERVE_KV_TRANSFER_ID: target.transfer_id, PDSERVE_KV_TRANSFER_BACKEND: self._backend}
        return ended, self._tracing.tracer.start_span("kv_transfer", attributes=attributes, start_time=arrival[1])

    async def _transfer_done(self, transfer_id: str, ended: TransferEnd, span: trace.Span) -> TransferDone:
        """Wait for the transfer's end: TransferDone after DONE (recorded on the "kv_transfer" span), else raise."""
        error = await ended
        if error is not None:
            raise error
        stats = self._sender.stats(transfer_id)
        span.set_attributes(
            {PDSERVE_KV_TRANSFER_BYTES: stats.num_bytes, PDSERVE_KV_TRANSFER_DURATION_S: stats.duration_s}
        )
        span.add_event(EVENT_KV_TRANSFER_DONE, {"num_blocks": stats.num_blocks})
        return TransferDone(stats.num_blocks, stats.num_bytes, stats.duration_s)

    def _close(
        self, target: KVTarget, request_id: str, ended: TransferEnd, finished: bool, aborted: bool, arrival: float
    ) -> None:
        """A call ended, however: stop its shipment (aborting the transfer, unless it already ended) and log it."""
        transfer_id = target.transfer_id
        self._transfer_ends.close(transfer_id)
        self._chunk_spans.pop_first_scheduled_ns(transfer_id)
        self._shipper.forget(transfer_id, None if ended.done() else target.endpoint)
        if not finished:
            state = "failed" if ended.done() and ended.result() is not None else "aborted"
            logger.info("prefill of request %r (transfer %s) ended early: %s", request_id, transfer_id, state)
        if aborted:
            self._metrics.observe_finished("abort", time.monotonic() - arrival, 0)

    async def _traced_first_token(
        self,
        request_id: str,
        transfer_id: str,
        prompt_token_ids: list[int],
        first_params: SamplingParams,
        params: SamplingParams,
        cache_salt: str | None,
        arrival: tuple[float, int],
    ) -> FirstToken | None:
        """`_first_token` inside the "prefill" span, with the prefill pod's metrics of a first token; `arrival` is
        (time.monotonic(), time.time_ns())."""
        attributes: Attributes = {
            PDSERVE_REQUEST_ID: request_id,
            PDSERVE_KV_TRANSFER_ID: transfer_id,
            GEN_AI_REQUEST_MODEL: self.info.model_id,
            GEN_AI_USAGE_INPUT_TOKENS: len(prompt_token_ids),
        }
        with self._tracing.span("prefill", attributes):
            first = await self._first_token(
                transfer_id, prompt_token_ids, first_params, params, cache_salt, arrival[0], capture_context()
            )
            if first is None:
                return None
            first_scheduled_ns = self._chunk_spans.pop_first_scheduled_ns(transfer_id)
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
        transfer_id: str,
        prompt_token_ids: list[int],
        first_params: SamplingParams,
        params: SamplingParams,
        cache_salt: str | None,
        arrival: float,
        trace_context: otel_context.Context,
    ) -> FirstToken | None:
        """Add the request and wait for its token; None if it was aborted (its transfer ended first)."""

        def add(engine: LLMEngine) -> None:
            engine.add_request(transfer_id, prompt_token_ids, first_params, hold_kv=True, cache_salt=cache_salt)
            self._shipper.admitted(transfer_id)
            self._chunk_spans.track(transfer_id, len(prompt_token_ids), trace_context)

        async with aclosing(self._async_engine.generate(transfer_id, add)) as outputs:
            async for output in outputs:
                if output.new_token_ids:
                    duration_s = time.monotonic() - arrival
                    return FirstToken.of(output, params, duration_s, self.info.max_model_len)
        return None

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
