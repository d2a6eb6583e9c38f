"""DecodeKV: a decode pod's engine core side of KV transfer, over the pod's KV receiver.

Lifecycle of one request (its engine request id is the transfer id):
1. `ReserveKV`: the engine reserves ceil(num_prompt_tokens / block_size) blocks and the receiver expects the transfer
   into them under a lease, in one operation, answered by `KVReserved` (block ids, or None when the pool is full).
2. A prefill pod writes the blocks. `AddPrefilledRequest` is checked at once (its input) and waits for the transfer;
   once it is DONE (and the reservation holds the prompt's blocks), the core claims it and admits the request with
   its prompt KV computed (claim + admit in one operation, before the next step). A transfer that ends otherwise, or
   that is unknown, fails the request.
   Until then the reservation's blocks count in `num_reserved_blocks` (the load snapshot's, for the autoscaler):
   held, but by no admitted request.
3. A reservation that ends without a claim (lease lapsed, `ReleaseKV`, an abort, a failed transfer) fires the
   receiver's `on_released` hook on its housekeeping thread; the core frees the blocks on its own thread and reports
   `ReservationEnded`.
`AbortRequest` ends the request at any of these points: its reservation (if unclaimed) is aborted, a running
request is aborted, and its blocks are freed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from common.errors import InvalidArgumentError, PdserveError
from engine.core.commands import AddPrefilledRequest, KVReserved, ReleaseKV, ReserveKV
from engine.core.outputs import CoreOutputs, ErrorInfo, RequestFailed, ReservationEnded
from engine.llm_engine import LLMEngine
from kv_transfer.base import KVReceiver
from kv_transfer.state import TransferAbortedError, TransferError, TransferExpiredError, TransferState

_ENDED_ERRORS: dict[TransferState, type[TransferError]] = {
    TransferState.EXPIRED: TransferExpiredError,
    TransferState.ABORTED: TransferAbortedError,
}


@dataclass(slots=True, frozen=True)
class ReservationReleased:
    """The receiver's notice (from its housekeeping thread) that a reservation ended without a claim."""

    req_id: str
    state: TransferState


class DecodeKV:
    """Reservations and claims of one decode engine; `notify(notice)` hands a receiver hook's notice to the core's
    thread (thread-safe)."""

    def __init__(self, engine: LLMEngine, receiver: KVReceiver, notify: Callable[[object], None]) -> None:
        self._engine = engine
        self.receiver = receiver
        receiver.on_released = lambda req_id, state: notify(ReservationReleased(req_id, state))
        self._claims: dict[str, AddPrefilledRequest] = {}
        """Requests waiting for their transfer to be DONE, in arrival order."""
        self._reserved: dict[str, int] = {}
        """Blocks of each reservation whose request is not admitted yet (its KV not computed or not arrived)."""

    @property
    def waiting(self) -> bool:
        """Whether requests wait for their transfers (the core polls them then, even with nothing to step)."""
        return bool(self._claims)

    @property
    def num_reserved_blocks(self) -> int:
        """Blocks held by reservations whose request is not admitted yet: in use, but by no running request."""
        return sum(self._reserved.values())

    def reserve(self, command: ReserveKV, out: CoreOutputs) -> None:
        engine = self._engine
        try:
            block_ids = engine.reserve_kv(command.req_id, command.num_prompt_tokens)
        except InvalidArgumentError as exc:
            out.failures.append(RequestFailed(command.req_id, ErrorInfo.of(exc)))
            return
        if block_ids is not None:
            try:
                self.receiver.expect(command.req_id, block_ids, command.lease_s)
            except BaseException:
                engine.release_kv(command.req_id)
                raise
            self._reserved[command.req_id] = len(block_ids)
        out.replies.append(KVReserved(command.req_id, None if block_ids is None else tuple(block_ids)))

    def add_prefilled(self, command: AddPrefilledRequest, out: CoreOutputs) -> None:
        """Check the request now; admit it once its transfer is DONE (`poll`)."""
        if command.req_id in self._claims or command.req_id in self._engine.scheduler.requests:
            error = InvalidArgumentError("transfer_id", f"{command.req_id!r} is already being decoded")
            out.failures.append(RequestFailed(command.req_id, ErrorInfo.of(error)))
            return
        try:
            self._check(command)
        except InvalidArgumentError as exc:
            self.receiver.abort(command.req_id)
            out.failures.append(RequestFailed(command.req_id, ErrorInfo.of(exc)))
            return
        self._claims[command.req_id] = command

    def release(self, command: ReleaseKV) -> None:
        """End an unclaimed reservation (its hook frees the blocks); a no-op once claimed."""
        self._claims.pop(command.req_id, None)
        self.receiver.abort(command.req_id)

    def abort(self, req_id: str) -> None:
        """The request's reservation ends (if unclaimed) before its blocks are freed, so no chunk lands after."""
        self._claims.pop(req_id, None)
        self._reserved.pop(req_id, None)
        self.receiver.abort(req_id)

    def poll(self, out: CoreOutputs) -> None:
        """Claim and admit every waiting request whose transfer is DONE; fail those whose transfer ended otherwise."""
        for req_id, command in list(self._claims.items()):
            try:
                state = self.receiver.state(req_id)
                if not state.is_final:
                    continue
                del self._claims[req_id]
                # NOTE: admitted below, or failed and freed: either way no longer a reservation.
                self._reserved.pop(req_id, None)
                if state is not TransferState.DONE:
                    error = _ENDED_ERRORS.get(state, TransferError)
                    raise error(f"KV transfer {req_id!r} ended {state.value} before all blocks arrived")
                self._check_blocks(command)
                self.receiver.claim(req_id)
                self._engine.add_prefilled_request(
                    req_id, command.prompt_token_ids, command.first_token_id, command.params
                )
            except PdserveError as exc:
                self._claims.pop(req_id, None)
                self.receiver.abort(req_id)
                self._engine.abort_requests([req_id])
                out.failures.append(RequestFailed(req_id, ErrorInfo.of(exc)))

    def on_notice(self, notice: object, out: CoreOutputs) -> None:
        if isinstance(notice, ReservationReleased):
            # NOTE: the reservation is no request, so abort_requests just releases its blocks.
            self._engine.abort_requests([notice.req_id])
            self._reserved.pop(notice.req_id, None)
            out.reservations_ended.append(ReservationEnded(notice.req_id, notice.state))

    def close(self) -> None:
        """Live reservations end ABORTED (their hooks run before this returns)."""
        self.receiver.close()

    def _check(self, command: AddPrefilledRequest) -> None:
        engine, info = self._engine, self._engine.info
        engine.validate(command.prompt_token_ids, command.params)
        if not 0 <= command.first_token_id < info.vocab_size:
            raise InvalidArgumentError(
                "first_token_id", f"{command.first_token_id} is outside the vocabulary [0, {info.vocab_size})"
            )
        if command.params.max_tokens < 2:
            raise InvalidArgumentError(
                "max_tokens",
                "must be >= 2 for Decode (the first token came from the prefill pod); release the reservation instead",
            )

    def _check_blocks(self, command: AddPrefilledRequest) -> None:
        """The transfer is DONE: its reservation must hold exactly the prompt's blocks."""
        num_blocks = len(self._engine.kv_cache_manager.get_block_ids(command.req_id))
        expected = -(-len(command.prompt_token_ids) // self._engine.info.block_size)
        if num_blocks != expected:
            raise InvalidArgumentError(
                "prompt_token_ids",
                f"{len(command.prompt_token_ids)} tokens need {expected} blocks; the reservation holds {num_blocks}",
            )
