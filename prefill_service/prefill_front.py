"""PrefillFront: the prefill role's request path on the pod's event loop, over its engine core process.

Lifecycle of one Prefill call (the engine request id is the transfer id, unique per decode reservation):
1. the request and its KV target are checked against this pod (input, backend, layout, number of blocks), then
   admitted (calls waiting for their first token are limited: beyond, ResourceExhaustedError);
2. the core queues the request with max_tokens forced to 1 (the rest of its sampling params unchanged) and ships
   its blocks to the decode pod as the engine computes them, keeping the reservation alive while it waits
   (`AddRequest`; see engine.core.prefill_kv);
3. the first sampled token is reported at once (FirstToken) while the transfer goes on;
4. the core reports the transfer's end (its held blocks freed by then): the call ends with TransferDone after DONE,
   the transfer's TransferError otherwise.
If the first token already ends the request, the transfer is aborted and the call ends after FirstToken. Cancelling
the call aborts the engine request and the transfer; every path frees the blocks. The engine core dying fails every
open call (EngineDeadError: UNAVAILABLE, so the router migrates).
Telemetry: a "prefill" span (arrival to first token) with a "prefill.chunk" child per engine step that computed part
of the prompt (`prefill_service.chunk_spans`), and a "kv_transfer" span (arrival to the transfer's end); the
transfer's metrics; a transfer that ends without DONE, and a call that ends early, are logged.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from opentelemetry import trace

from common.errors import PdserveError, UnavailableError
from common.kv_cache_events import KVCacheEvent
from common.metrics import ServiceMetrics
from common.multimodal import ImageInput
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
    Tracing,
    capture_context,
)
from engine.core.client import EngineDeadError
from engine.core.commands import AbortRequest, AddRequest
from engine.core.messages import CoreReady
from engine.core.outputs import CoreOutputs, TransferEnded
from engine.scheduler_output import EngineOutput
from kv_transfer.state import TransferError, TransferState
from kv_transfer.target import KVTarget
from pod.admission import Admission
from pod.front import CoreFront
from prefill_service.chunk_spans import ChunkSpans
from prefill_service.prefill_checks import PrefillChecks
from prefill_service.prefill_events import FirstToken, PrefillEvent, TransferDone

logger = logging.getLogger(__name__)

KVEventSink = Callable[[Sequence[KVCacheEvent]], None]

PDSERVE_QUEUE_TIME_S = "pdserve.prefill.queue_time_s"
PDSERVE_NUM_CACHED_TOKENS = "pdserve.prefill.num_cached_tokens"
KEEPALIVES_PER_LEASE = 3
"""The core's KV shipper keeps a request's reservation alive this many times per lease (`AddRequest.keepalive_s`)."""


@dataclass(slots=True)
class _Call:
    """One open Prefill call: what it waits for."""

    request_id: str
    first: asyncio.Future[EngineOutput] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    ended: asyncio.Future[TransferEnded] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def fail(self, error: PdserveError) -> None:
        for future in (self.first, self.ended):
            if not future.done():
                future.set_exception(error)
                # NOTE: marked retrieved: a call that failed at its first token never awaits `ended`.
                future.exception()


class PrefillFront(CoreFront):
    """Runs Prefill calls over one engine core; see the module docstring. Build it with a started core's `CoreReady`
    and attach it with `bind(client)`."""

    def __init__(
        self,
        ready: CoreReady,
        backend: str,
        lease_s: float,
        admission: Admission,
        on_kv_events: KVEventSink | None = None,
        tracing: Tracing | None = None,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        """`lease_s` is the decode pods' reservation lease assumed when a KV target does not name its own."""
        super().__init__("prefill", ready, tracing, metrics)
        self._backend = backend
        self._lease_s = lease_s
        self._admission = admission
        self._on_kv_events = on_kv_events
        assert ready.kv_layout is not None, "a prefill pod's core has a KV sender"
        self._checks = PrefillChecks(ready.info, ready.kv_layout, backend)
        self._chunk_spans = ChunkSpans(self._tracing.tracer)
        self._calls: dict[str, _Call] = {}

    @property
    def num_in_flight(self) -> int:
        return len(self._calls)

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
        images: tuple[ImageInput, ...] = (),
    ) -> AsyncIterator[PrefillEvent]:
        """Run one Prefill call: yields FirstToken, then (unless it ended the request) TransferDone.

        Raises InvalidArgumentError for bad input, LayoutMismatchError for a foreign KV layout, UnavailableError
        while draining, ResourceExhaustedError beyond the admission limits, and the transfer's TransferError if it
        ends without DONE. `request_id` (the router's) is only for logs and spans. `images`: the prompt's, for the
        engine's vision encoder.
        """
        if self._draining:
            raise UnavailableError("prefill pod is draining")
        self._checks.check(prompt_token_ids, params, target, self._calls)
        core = self._core()
        ticket = self._admission.admit("", len(prompt_token_ids))
        arrival, arrival_ns = time.monotonic(), time.time_ns()
        transfer_id = target.transfer_id
        call = self._calls[transfer_id] = _Call(request_id)
        attributes = {PDSERVE_KV_TRANSFER_ID: transfer_id, PDSERVE_KV_TRANSFER_BACKEND: self._backend}
        transfer_span = self._tracing.tracer.start_span("kv_transfer", attributes=attributes, start_time=arrival_ns)
        transfer_ended = got_first = finished = False
        outcome = "aborted"
        try:
            with self._tracing.span("prefill", self._prefill_attributes(request_id, transfer_id, prompt_token_ids)):
                self._chunk_spans.track(transfer_id, len(prompt_token_ids), capture_context())
                # NOTE: keepalives well within the lease, which started at Reserve, a little before this call arrived.
                keepalive_s = (target.lease_s or self._lease_s) / KEEPALIVES_PER_LEASE
                first_params = dataclasses.replace(params, max_tokens=1)
                core.send(
                    AddRequest(transfer_id, prompt_token_ids, first_params, target, keepalive_s, cache_salt, images)
                )
                first = await self._first_token(call, transfer_id, prompt_token_ids, params, (arrival, arrival_ns))
            got_first = True
            self._admission.start(ticket)
            yield first
            if first.finish_reason is not None:
                finished = True
                return  # no decode follows: the transfer is aborted below
            ended = await call.ended
            transfer_ended = True
            done = self._transfer_done(ended, transfer_span)
            finished = True
            yield done
        except Exception:
            outcome = "failed"
            raise
        finally:
            self._admission.finish(ticket)
            self._close(transfer_id, call, transfer_ended or call.ended.done(), None if finished else outcome)
            if not got_first:
                self._metrics.observe_finished("abort", time.monotonic() - arrival, 0)
            transfer_span.end()

    def on_outputs(self, out: CoreOutputs) -> None:
        """Every turn of the core, on the event loop: failures, first tokens, transfer ends, cache events, load."""
        for failure in out.failures:
            call = self._calls.get(failure.req_id)
            if call is not None:
                call.fail(failure.error.to_error())
        for ended in out.transfers_ended:
            self._transfer_ended(ended)
        for output in out.outputs:
            call = self._calls.get(output.req_id)
            if call is None or call.first.done():
                continue
            if output.new_token_ids:
                call.first.set_result(output)
            elif output.finish_reason is not None:
                call.fail(TransferError(f"request {output.req_id!r} was aborted before its first token"))
        if out.cache_events and self._on_kv_events is not None:
            self._on_kv_events(out.cache_events)
        now_ns = time.time_ns()
        for progress in out.prefill_progress:
            self._chunk_spans.on_progress(progress, out.step_started_ns, now_ns)
        self.note_load(out.load)

    def on_dead(self, error: EngineDeadError) -> None:
        """The engine core died: every open call fails with `error`."""
        for call in self._calls.values():
            call.fail(error)

    async def _first_token(
        self,
        call: _Call,
        transfer_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival: tuple[float, int],
    ) -> FirstToken:
        """Wait for the request's first token, inside the "prefill" span; the prefill pod's first-token metrics."""
        output = await call.first
        first = FirstToken.of(output, params, time.monotonic() - arrival[0], self.info.max_model_len)
        first_scheduled_ns = self._chunk_spans.forget(transfer_id)
        ttft = first.prefill_duration_s
        queue_s = None if first_scheduled_ns is None else max(0.0, (first_scheduled_ns - arrival[1]) / 1e9)
        span = trace.get_current_span()
        span.set_attributes({PDSERVE_NUM_CACHED_TOKENS: first.num_cached_tokens})
        if queue_s is not None:
            span.set_attribute(PDSERVE_QUEUE_TIME_S, queue_s)
        span.add_event(EVENT_FIRST_TOKEN, {"token_id": first.token_id})
        self._metrics.observe_first_token(ttft, len(prompt_token_ids))
        prefill_s = None if queue_s is None else ttft - queue_s
        # NOTE: the engine request ends here, after one token ("length": max_tokens is 1), whatever follows.
        self._metrics.observe_finished(first.finish_reason or "length", ttft, 1, queue_s=queue_s, prefill_s=prefill_s)
        return first

    def _prefill_attributes(
        self, request_id: str, transfer_id: str, prompt_token_ids: list[int]
    ) -> dict[str, str | int]:
        return {
            PDSERVE_REQUEST_ID: request_id,
            PDSERVE_KV_TRANSFER_ID: transfer_id,
            GEN_AI_REQUEST_MODEL: self.info.model_id,
            GEN_AI_USAGE_INPUT_TOKENS: len(prompt_token_ids),
        }

    def _transfer_done(self, ended: TransferEnded, span: trace.Span) -> TransferDone:
        """TransferDone after DONE (recorded on the "kv_transfer" span); the transfer's error otherwise."""
        if ended.error is not None:
            raise ended.error.to_error()
        stats = ended.stats
        span.set_attributes(
            {PDSERVE_KV_TRANSFER_BYTES: stats.num_bytes, PDSERVE_KV_TRANSFER_DURATION_S: stats.duration_s}
        )
        span.add_event(EVENT_KV_TRANSFER_DONE, {"num_blocks": stats.num_blocks})
        return TransferDone(stats.num_blocks, stats.num_bytes, stats.duration_s)

    def _transfer_ended(self, ended: TransferEnded) -> None:
        """The core reports a transfer's end: count it, log a failure, end the call's wait."""
        if ended.state is TransferState.DONE:
            self._metrics.observe_kv_transfer(self._backend, ended.stats.num_bytes, ended.stats.duration_s)
        elif ended.state is TransferState.EXPIRED:
            self._metrics.count_kv_lease_expiry()
        elif ended.state is TransferState.FAILED:
            self._metrics.count_kv_transfer_failure(self._backend)
        call = self._calls.get(ended.req_id)
        if ended.error is not None:
            # NOTE: a transfer aborted after its call ended is this pod's own doing (a cancel, or no decode follows).
            log = logger.warning if call is not None else logger.debug
            request_id = None if call is None else call.request_id
            message = ended.error.message
            log("KV transfer %s of request %r ended %s: %s", ended.req_id, request_id, ended.state.value, message)
        if call is None:
            return
        if ended.error is not None and not call.first.done():
            # NOTE: the request is aborted with its transfer: the call fails with the transfer's error.
            call.fail(ended.error.to_error())
        elif not call.ended.done():
            call.ended.set_result(ended)

    def _close(self, transfer_id: str, call: _Call, transfer_ended: bool, early: str | None) -> None:
        """A call ended, however: abort its request and transfer unless the transfer already ended; log one that
        ended `early` ("failed" or "aborted")."""
        del self._calls[transfer_id]
        self._chunk_spans.forget(transfer_id)
        core = self._core()
        if not transfer_ended and not core.failed:
            core.send(AbortRequest(transfer_id))
        if early is not None:
            logger.info("prefill of request %r (transfer %s) ended early: %s", call.request_id, transfer_id, early)
