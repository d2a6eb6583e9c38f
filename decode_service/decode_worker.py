"""DecodeWorker: the decode role's request path, over an engine thread and a KV receiver.

Lifecycle of one request (its engine request id is the transfer id, chosen here at Reserve):
1. Reserve: admission first (reservations not yet decoding, and their prompt tokens, are limited: beyond,
   ResourceExhaustedError with a retry delay); then, on the engine thread, `reserve_kv` takes
   ceil(num_prompt_tokens / block_size) blocks and the receiver expects the transfer into them under a lease; no free
   blocks -> ResourceExhaustedError. A Reserve call cancelled meanwhile aborts what its command may have reserved.
2. A prefill pod writes the blocks. Decode waits until the transfer is DONE (polling the receiver: the event loop
   never blocks), then on the engine thread claims it and admits the request with its prompt KV computed
   (`add_prefilled_request`), and streams the tokens from the second one on.
3. A reservation that ends without a claim (lease lapsed, Release, a failed or aborted transfer, a cancelled or
   failed Decode call) fires the receiver's on_released hook, which frees its blocks in the engine.
Cancelling a Decode call aborts its request (or the transfer it waits for); its blocks are freed either way.
Telemetry: spans "decode.admission" (waiting for the transfer, then admission) and "decode.generate" (admission to
the last token, with the event "first_decode_token"); reservations that end unclaimed and calls that end early are
logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

from opentelemetry import trace

from common.errors import InvalidArgumentError, ResourceExhaustedError, UnavailableError
from common.metrics import ServiceMetrics
from common.sampling_params import SamplingParams
from common.telemetry import (
    EVENT_DECODE_ADMITTED,
    PDSERVE_KV_TRANSFER_ID,
    PDSERVE_REQUEST_ID,
    Tracing,
)
from decode_service.decode_metrics import measured
from engine.async_engine import AsyncEngine
from engine.llm_engine import LLMEngine
from engine.scheduler_output import EngineOutput
from kv_transfer.base import KVReceiver
from kv_transfer.state import TransferAbortedError, TransferError, TransferExpiredError, TransferState
from kv_transfer.target import KVTarget
from pod.admission import Admission, AdmissionLimits, Ticket
from pod.worker import PodLoad, read_load, report_engine_state

logger = logging.getLogger(__name__)

_MIN_POLL_S = 0.001
_MAX_POLL_S = 0.005
_ENDED_ERRORS: dict[TransferState, type[TransferError]] = {
    TransferState.EXPIRED: TransferExpiredError,
    TransferState.ABORTED: TransferAbortedError,
}


class DecodeWorker:
    """Serves Reserve, Decode and Release on one engine. Build it, `start()` it on the event loop, `aclose()` it."""

    def __init__(
        self,
        engine: LLMEngine,
        receiver: KVReceiver,
        backend: str,
        lease_s: float,
        generation: int = 0,
        tracing: Tracing | None = None,
        metrics: ServiceMetrics | None = None,
        admission: Admission | None = None,
        engine_nice: int = 0,
    ) -> None:
        """`admission` limits the reservations not yet decoding (default: no limit); `engine_nice`: AsyncEngine's."""
        self.info = engine.info
        self._receiver = receiver
        self._backend = backend
        self._lease_s = lease_s
        self._generation = generation
        self._tracing = tracing or Tracing(trace.NoOpTracer())
        self._metrics = metrics or ServiceMetrics("decode")
        self._load = read_load(engine)
        receiver.on_released = self._on_released
        self._async_engine = AsyncEngine(engine, _drop_cache_events, self._on_update, engine_nice)
        self._pending: set[str] = set()  # reserved, neither claimed nor ended yet
        self._request_ids: dict[str, str] = {}  # of pending transfers, for logs
        self._admission = admission or Admission(AdmissionLimits())
        self._tickets: dict[str, Ticket] = {}  # of pending transfers
        self._decoding: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False

    @property
    def kv_endpoint(self) -> str:
        """Where prefill pods reach this pod's KV receiver."""
        return self._receiver.endpoint

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._async_engine.start()

    async def aclose(self) -> None:
        """End live reservations (their blocks are freed), then stop the engine thread."""
        await asyncio.to_thread(self._receiver.close)
        await asyncio.to_thread(self._async_engine.stop)

    @property
    def num_in_flight(self) -> int:
        return len(self._pending) + len(self._decoding)

    @property
    def engine_failed(self) -> bool:
        return self._async_engine.failed

    def start_draining(self) -> None:
        self._draining = True

    def load(self) -> PodLoad:
        """The engine's load after its last step or command (see pod.worker.PodWorker)."""
        return self._load

    async def reserve(self, num_prompt_tokens: int, max_tokens: int, request_id: str = "") -> KVTarget:
        """Reserve the prompt's blocks under a lease (ResourceExhaustedError when the pool cannot supply them);
        `request_id` (the router's) is only for logs."""
        if self._draining:
            raise UnavailableError("decode pod is draining")
        self._check_reserve(num_prompt_tokens, max_tokens)
        ticket = self._admission.admit("", num_prompt_tokens)
        transfer_id = uuid.uuid4().hex

        def reserve(engine: LLMEngine) -> list[int] | None:
            return self._reserve_and_lease(engine, transfer_id, num_prompt_tokens)

        # NOTE: counted as pending before its lease starts, so that the discard by its release always comes after.
        self._pending.add(transfer_id)
        self._request_ids[transfer_id] = request_id
        self._tickets[transfer_id] = ticket
        try:
            block_ids = await self._async_engine.call(reserve)
        except BaseException:
            self._forget(transfer_id)
            # NOTE: a call cancelled while its command ran may have reserved all the same; this abort runs on the
            # engine thread after that command, so the blocks are freed now rather than when the lease lapses.
            self._async_engine.submit(lambda engine: self._receiver.abort(transfer_id))
            raise
        if block_ids is None:
            self._forget(transfer_id)
            raise ResourceExhaustedError(
                f"no {-(-num_prompt_tokens // self.info.block_size)} free KV blocks for "
                f"{num_prompt_tokens} prompt tokens"
            )
        return KVTarget(
            transfer_id, self._backend, self._receiver.endpoint, tuple(block_ids), self._receiver.layout, self._lease_s,
            self._generation,
        )  # fmt: skip

    async def decode(
        self,
        transfer_id: str,
        prompt_token_ids: list[int],
        first_token_id: int,
        params: SamplingParams,
        request_id: str = "",
    ) -> AsyncIterator[EngineOutput]:
        """Wait for the transfer, admit the request and stream its outputs (token 2 on).

        Raises InvalidArgumentError for bad input and a TransferError if the transfer ends without DONE (or is
        unknown); the reservation is freed then. `request_id` (the router's) is only for logs and spans.
        """
        if transfer_id in self._decoding:
            raise InvalidArgumentError("transfer_id", f"{transfer_id!r} is already being decoded")
        self._decoding.add(transfer_id)
        self._forget(transfer_id)
        arrival = time.monotonic()
        attributes = {PDSERVE_REQUEST_ID: request_id, PDSERVE_KV_TRANSFER_ID: transfer_id}
        admission = self._tracing.tracer.start_span("decode.admission", attributes=attributes)
        finish_reason: str | None = None
        try:
            self._check_decode(prompt_token_ids, first_token_id, params)
            await self._wait_for_transfer(transfer_id)
            generate = self._tracing.tracer.start_span("decode.generate", attributes=attributes)

            def admit(engine: LLMEngine) -> None:
                self._admit(engine, transfer_id, prompt_token_ids, first_token_id, params)
                admission.add_event(EVENT_DECODE_ADMITTED)
                admission.end()

            try:
                async with aclosing(self._async_engine.generate(transfer_id, admit)) as outputs:
                    async for output in measured(outputs, self._metrics, arrival, generate):
                        finish_reason = output.finish_reason
                        yield output
            finally:
                generate.end()
        finally:
            admission.end()
            self._decoding.discard(transfer_id)
            self._receiver.abort(transfer_id)
            if finish_reason is None:
                logger.info("decode of request %r (transfer %s) ended early: aborted", request_id, transfer_id)

    def release(self, transfer_id: str) -> None:
        """Free a reservation now; unknown, ended or claimed transfers are left alone."""
        self._forget(transfer_id)
        self._receiver.abort(transfer_id)

    def _check_reserve(self, num_prompt_tokens: int, max_tokens: int) -> None:
        if num_prompt_tokens < 1:
            raise InvalidArgumentError("num_prompt_tokens", f"must be >= 1, got {num_prompt_tokens}")
        if num_prompt_tokens + max_tokens > self.info.max_model_len:
            raise InvalidArgumentError(
                "max_tokens",
                f"num_prompt_tokens ({num_prompt_tokens}) + max_tokens ({max_tokens}) exceeds max_model_len "
                f"{self.info.max_model_len}",
            )

    def _reserve_and_lease(self, engine: LLMEngine, transfer_id: str, num_prompt_tokens: int) -> list[int] | None:
        """Engine thread: reserve the blocks and start their lease in one command, so that a Reserve call cancelled
        meanwhile leaves at worst a lease that lapses, never blocks without an owner."""
        block_ids = engine.reserve_kv(transfer_id, num_prompt_tokens)
        if block_ids is not None:
            try:
                self._receiver.expect(transfer_id, block_ids, self._lease_s)
            except BaseException:
                engine.release_kv(transfer_id)
                raise
        return block_ids

    def _check_decode(self, prompt_token_ids: list[int], first_token_id: int, params: SamplingParams) -> None:
        # NOTE: validate() only reads the engine's immutable RuntimeInfo: safe off the engine thread.
        self._async_engine.engine.validate(prompt_token_ids, params)
        if not 0 <= first_token_id < self.info.vocab_size:
            raise InvalidArgumentError(
                "first_token_id", f"{first_token_id} is outside the vocabulary [0, {self.info.vocab_size})"
            )
        if params.max_tokens < 2:
            raise InvalidArgumentError(
                "max_tokens",
                "must be >= 2 for Decode (the first token came from the prefill pod); release the reservation instead",
            )

    async def _wait_for_transfer(self, transfer_id: str) -> None:
        delay = _MIN_POLL_S
        while not (state := self._receiver.state(transfer_id)).is_final:
            await asyncio.sleep(delay)
            delay = min(2 * delay, _MAX_POLL_S)
        if state is not TransferState.DONE:
            error = _ENDED_ERRORS.get(state, TransferError)
            raise error(f"KV transfer {transfer_id!r} ended {state.value} before all blocks arrived")

    def _admit(
        self,
        engine: LLMEngine,
        transfer_id: str,
        prompt_token_ids: list[int],
        first_token_id: int,
        params: SamplingParams,
    ) -> None:
        """Engine thread: claim the finished transfer and admit its request in one command."""
        num_blocks = len(engine.kv_cache_manager.get_block_ids(transfer_id))
        expected = -(-len(prompt_token_ids) // self.info.block_size)
        if num_blocks != expected:
            raise InvalidArgumentError(
                "prompt_token_ids",
                f"{len(prompt_token_ids)} tokens need {expected} blocks; the reservation holds {num_blocks}",
            )
        self._receiver.claim(transfer_id)
        engine.add_prefilled_request(transfer_id, prompt_token_ids, first_token_id, params)

    def _forget(self, transfer_id: str) -> None:
        """Event loop: the reservation is no longer pending (claimed, or ended)."""
        self._pending.discard(transfer_id)
        self._request_ids.pop(transfer_id, None)
        ticket = self._tickets.pop(transfer_id, None)
        if ticket is not None:
            self._admission.finish(ticket)

    def _on_update(self, engine: LLMEngine) -> None:
        """Engine thread, after every step and command: the load snapshot and the metrics' engine state."""
        self._load = report_engine_state(self._metrics, engine)

    def _on_released(self, transfer_id: str, state: TransferState) -> None:
        """Receiver housekeeping thread: a reservation ended without a claim; count and log it, free its blocks.

        NOTE: the reservation is no request, so abort_requests just releases its blocks (on the engine thread).
        """
        if state is TransferState.EXPIRED:
            self._metrics.count_kv_lease_expiry()
        log = logger.info if state is TransferState.ABORTED else logger.warning
        log("KV reservation of request %r (transfer %s) ended %s before its claim; its blocks are freed",
            self._request_ids.get(transfer_id, ""), transfer_id, state.value)  # fmt: skip
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._forget, transfer_id)
        self._async_engine.abort(transfer_id)


def _drop_cache_events(engine: LLMEngine, outputs: list[EngineOutput]) -> None:
    """Engine thread, after every step: decode pods publish no prefix cache, so its events are dropped."""
    engine.kv_cache_manager.take_events()
