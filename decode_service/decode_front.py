"""DecodeFront: the decode role's request path on the pod's event loop, over its engine core process.

Lifecycle of one request (its engine request id is the transfer id, chosen here at Reserve):
1. Reserve: admission first (reservations not yet decoding, and their prompt tokens, are limited: beyond,
   ResourceExhaustedError with a retry delay); then the core reserves ceil(num_prompt_tokens / block_size) blocks
   and starts their lease in one operation (`ReserveKV`); a full pool is a ResourceExhaustedError. A Reserve call
   cancelled meanwhile aborts what the core may have reserved (commands apply in order).
2. A prefill pod writes the blocks. A DecodeStart on a router's DecodeStream claims the reservation
   (`AddPrefilledRequest`): the core admits the request once its transfer is DONE and decodes from the second token
   on. Each engine turn's outputs are dispatched to the requests' streams: one message per stream per step
   (`decode_service.decode_stream`); a finish or an error ends the request on its stream.
3. A reservation that ends without a claim (lease lapsed, Release, a failed or aborted transfer) is reported by the
   core (`ReservationEnded`), counted and logged; its blocks are already freed.
A DecodeCancel, or the end of the request's stream, aborts the request in the core; its blocks are freed either way.
The engine core dying fails every open request and Reserve (EngineDeadError: UNAVAILABLE, so the router migrates).
Telemetry: spans "decode.admission" (DecodeStart to the first decode token) and "decode.generate" (from there to the
last token), per-token metrics, and the engine's load after every turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

from common.errors import InvalidArgumentError, PdserveError, ResourceExhaustedError, UnavailableError
from common.metrics import ServiceMetrics
from common.telemetry import Tracing, context_from_carrier
from decode_service.decode_metrics import DecodeMeasure
from decode_service.decode_stream import DecodeStart, DecodeStreamSession, StreamEnd
from engine.core.client import EngineDeadError
from engine.core.commands import AbortRequest, AddPrefilledRequest, ReleaseKV, ReserveKV
from engine.core.messages import CoreReady
from engine.core.outputs import CoreOutputs
from engine.scheduler_output import BeamSearchOutput
from kv_transfer.state import TransferState
from kv_transfer.target import KVTarget
from pod.admission import Admission, Ticket
from pod.front import CoreFront

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Reservation:
    """A reservation not claimed yet."""

    request_id: str
    ticket: Ticket
    reply: asyncio.Future[tuple[int, ...] | None] | None
    """Set while Reserve waits for the core's answer."""


@dataclass(slots=True)
class _Decoding:
    """A request being decoded: where its tokens go, and its measurements."""

    session: DecodeStreamSession
    key: int
    logprobs: bool
    measure: DecodeMeasure


class DecodeFront(CoreFront):
    """Serves Reserve, DecodeStream and Release over one engine core; see the module docstring. Build it with a
    started core's `CoreReady` and attach it with `bind(client)`."""

    def __init__(
        self,
        ready: CoreReady,
        backend: str,
        lease_s: float,
        admission: Admission,
        generation: int = 0,
        tracing: Tracing | None = None,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        super().__init__("decode", ready, tracing, metrics)
        self._ready = ready
        self._backend = backend
        self._lease_s = lease_s
        self._admission = admission
        self._generation = generation
        self._reservations: dict[str, _Reservation] = {}
        self._decoding: dict[str, _Decoding] = {}

    @property
    def kv_endpoint(self) -> str:
        return self._ready.kv_endpoint

    @property
    def num_in_flight(self) -> int:
        return len(self._reservations) + len(self._decoding)

    async def reserve(self, num_prompt_tokens: int, max_tokens: int, request_id: str = "") -> KVTarget:
        """Reserve the prompt's blocks under a lease (ResourceExhaustedError when the pool cannot supply them);
        `request_id` (the router's) is only for logs."""
        if self._draining:
            raise UnavailableError("decode pod is draining")
        self._check_reserve(num_prompt_tokens, max_tokens)
        core = self._core()
        ticket = self._admission.admit("", num_prompt_tokens)
        transfer_id = uuid.uuid4().hex
        reply: asyncio.Future[tuple[int, ...] | None] = asyncio.get_running_loop().create_future()
        self._reservations[transfer_id] = _Reservation(request_id, ticket, reply)
        try:
            core.send(ReserveKV(transfer_id, num_prompt_tokens, self._lease_s))
            block_ids = await reply
        except BaseException:
            self._forget(transfer_id)
            # NOTE: the core may have reserved all the same; this abort comes after the reservation there.
            if not core.failed:
                core.send(AbortRequest(transfer_id))
            raise
        if block_ids is None:
            self._forget(transfer_id)
            raise ResourceExhaustedError(
                f"no {-(-num_prompt_tokens // self.info.block_size)} free KV blocks for "
                f"{num_prompt_tokens} prompt tokens"
            )
        reservation = self._reservations.get(transfer_id)
        if reservation is not None:
            reservation.reply = None
        ready = self._ready
        assert ready.kv_layout is not None, "a decode pod's core has a KV receiver"
        return KVTarget(
            transfer_id,
            self._backend,
            ready.kv_endpoint,
            block_ids,
            ready.kv_layout,
            self._lease_s,
            self._generation,
        )

    def release(self, transfer_id: str) -> None:
        """Free a reservation now; unknown, ended or claimed transfers are left alone."""
        if self._forget(transfer_id):
            self._core().send(ReleaseKV(transfer_id))

    def start(self, session: DecodeStreamSession, start: DecodeStart) -> None:
        """Claim `start.transfer_id`'s reservation and decode its request on `session` (errors end it there)."""
        parent = context_from_carrier(start.trace_context)
        measure = DecodeMeasure(self._tracing, self._metrics, start.request_id, start.transfer_id, parent)
        if start.transfer_id in self._decoding or start.key in session.transfer_ids:
            error = InvalidArgumentError("transfer_id", f"{start.transfer_id!r} is already being decoded")
            session.end(StreamEnd(start.key, error=error))
            session.flush()
            return
        self._forget(start.transfer_id)
        session.transfer_ids[start.key] = start.transfer_id
        self._decoding[start.transfer_id] = _Decoding(session, start.key, start.params.logprobs, measure)
        try:
            self._core().send(
                AddPrefilledRequest(start.transfer_id, start.prompt_token_ids, start.first_token_id, start.params)
            )
        except EngineDeadError as exc:
            self._end(start.transfer_id, StreamEnd(start.key, error=exc))
            session.flush()

    def cancel(self, session: DecodeStreamSession, key: int) -> None:
        """End a request of `session` early (its blocks are freed); unknown keys are ignored."""
        transfer_id = session.transfer_ids.pop(key, None)
        if transfer_id is None:
            return
        decoding = self._decoding.pop(transfer_id, None)
        if decoding is not None:
            decoding.measure.ended(None)
            request_id = decoding.measure.request_id
            logger.info("decode of request %r (transfer %s) ended early: cancelled", request_id, transfer_id)
        core = self._core()
        if not core.failed:
            core.send(AbortRequest(transfer_id))

    def close_session(self, session: DecodeStreamSession) -> None:
        """The stream ended: every request still open on it ends."""
        for key in list(session.transfer_ids):
            self.cancel(session, key)
        session.close()

    def on_outputs(self, out: CoreOutputs) -> None:
        """Every turn of the core, on the event loop: answers, failures, tokens and ends, load."""
        touched: set[DecodeStreamSession] = set()
        for reply in out.replies:
            reservation = self._reservations.get(reply.req_id)
            if reservation is not None and reservation.reply is not None and not reservation.reply.done():
                reservation.reply.set_result(reply.block_ids)
        for failure in out.failures:
            self._fail(failure.req_id, failure.error.to_error(), touched)
        now = time.monotonic()
        for output in out.outputs:
            decoding = self._decoding.get(output.req_id)
            if decoding is None:
                continue
            beams = output.beams if isinstance(output, BeamSearchOutput) else ()
            if output.new_token_ids and not beams:
                logprobs = [lp for lp in output.new_logprobs if lp is not None] if decoding.logprobs else None
                decoding.session.add(decoding.key, output.new_token_ids, logprobs)
                decoding.measure.tokens(len(output.new_token_ids), now)
            if output.finish_reason is not None:
                end = StreamEnd(decoding.key, output.finish_reason, output.stop_reason, beams=tuple(beams))  # type: ignore[arg-type]
                self._end(output.req_id, end)
            touched.add(decoding.session)
        for ended in out.reservations_ended:
            self._reservation_ended(ended.req_id, ended.state)
        for session in touched:
            session.flush()
        self.note_load(out.load)

    def on_dead(self, error: EngineDeadError) -> None:
        """The engine core died: every open Reserve and request fails with `error`."""
        touched: set[DecodeStreamSession] = set()
        for transfer_id in [*self._reservations, *self._decoding]:
            self._fail(transfer_id, error, touched)
        for session in touched:
            session.flush()

    def _fail(self, transfer_id: str, error: PdserveError, touched: set[DecodeStreamSession]) -> None:
        reservation = self._reservations.get(transfer_id)
        if reservation is not None and reservation.reply is not None and not reservation.reply.done():
            reservation.reply.set_exception(error)
            return
        decoding = self._decoding.get(transfer_id)
        if decoding is not None:
            self._end(transfer_id, StreamEnd(decoding.key, error=error))
            touched.add(decoding.session)
            request_id = decoding.measure.request_id
            logger.info("decode of request %r (transfer %s) failed: %s", request_id, transfer_id, error)

    def _end(self, transfer_id: str, end: StreamEnd) -> None:
        decoding = self._decoding.pop(transfer_id)
        decoding.measure.ended(end.finish_reason)
        decoding.session.end(end)

    def _reservation_ended(self, transfer_id: str, state: TransferState) -> None:
        """A reservation ended without a claim: count and log it (its blocks are freed)."""
        reservation = self._reservations.get(transfer_id)
        self._forget(transfer_id)
        if state is TransferState.EXPIRED:
            self._metrics.count_kv_lease_expiry()
        if reservation is None and state is TransferState.ABORTED:
            return  # NOTE: released or aborted by this pod: logged where that happened, if at all
        log = logger.info if state is TransferState.ABORTED else logger.warning
        request_id = "" if reservation is None else reservation.request_id
        log(
            "KV reservation of request %r (transfer %s) ended %s before its claim; its blocks are freed",
            request_id,
            transfer_id,
            state.value,
        )

    def _forget(self, transfer_id: str) -> bool:
        """The reservation is no longer pending (claimed, or ended); False if it was not."""
        reservation = self._reservations.pop(transfer_id, None)
        if reservation is None:
            return False
        self._admission.finish(reservation.ticket)
        return True

    def _check_reserve(self, num_prompt_tokens: int, max_tokens: int) -> None:
        if num_prompt_tokens < 1:
            raise InvalidArgumentError("num_prompt_tokens", f"must be >= 1, got {num_prompt_tokens}")
        if num_prompt_tokens + max_tokens > self.info.max_model_len:
            raise InvalidArgumentError(
                "max_tokens",
                f"num_prompt_tokens ({num_prompt_tokens}) + max_tokens ({max_tokens}) exceeds max_model_len "
                f"{self.info.max_model_len}",
            )
