"""Decode-side bookkeeping shared by every receiver backend: reservations, leases, which chunks may be written.

Invariants:
- a live reservation may be written only between `begin_chunk` and `end_chunk`; a connection may have a chunk
  begun before the last one ended (its copy queued behind the last one's), so `writes` counts them;
- a reservation is released (dropped and reported through `notify`) exactly once, and never while a write is open:
  an expiry or abort during a write takes effect at once for the state, and the release waits for the last
  `end_chunk`, so the engine never frees a block that is still being written;
- a DONE reservation waits for its claim at most `claim_window_s` (or its lease, if shorter): its Decode call comes
  right behind the transfer, and one that never comes (a call cancelled on its way) must not hold the blocks for a
  whole lease.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from common.errors import InvalidArgumentError
from kv_transfer.base import KVReceiver
from kv_transfer.bookkeeping.housekeeper import Housekeeper
from kv_transfer.copy_stream import PASSED, Fence
from kv_transfer.state import (
    InvalidChunkError,
    TransferAbortedError,
    TransferError,
    TransferExpiredError,
    TransferState,
    TransferStateError,
    TransportError,
    UnknownTransferError,
)

CLAIM_WINDOW_S = 5.0
"""How long a transferred (DONE) reservation waits for its claim, at most."""

_ENDED_ERRORS: dict[TransferState, type[TransferError]] = {
    TransferState.EXPIRED: TransferExpiredError,
    TransferState.ABORTED: TransferAbortedError,
    TransferState.FAILED: TransferStateError,
    TransferState.DONE: TransferStateError,
}


@dataclass(slots=True, eq=False)
class _Reservation:
    transfer_id: str
    block_ids: frozenset[int]
    lease_s: float
    deadline: float
    state: TransferState = TransferState.RESERVED
    received: set[int] = field(default_factory=set)
    writes: int = 0
    """Chunks begun and not ended yet."""
    fence: Fence = PASSED
    """The engine's work queued when the blocks were reserved: writes into them wait for it."""


class ReservationTable:
    """Thread-safe records of one receiver's transfers. `notify(transfer_id, state)` is called (under the lock, so
    it must only enqueue) when a reservation ends without a claim."""

    def __init__(
        self,
        num_blocks: int,
        notify: Callable[[str, TransferState], None],
        max_ended: int = 4096,
        claim_window_s: float = CLAIM_WINDOW_S,
    ) -> None:
        self._num_blocks = num_blocks
        self._notify = notify
        self._max_ended = max_ended
        self._claim_window_s = claim_window_s
        self._cond = threading.Condition()
        self._live: dict[str, _Reservation] = {}
        # NOTE: ended ids are remembered (bounded) only to answer state() and reject late chunks precisely.
        self._ended: OrderedDict[str, TransferState] = OrderedDict()

    def expect(self, transfer_id: str, dst_block_ids: Sequence[int], lease_s: float, fence: Fence = PASSED) -> None:
        block_ids = frozenset(dst_block_ids)
        if len(block_ids) != len(dst_block_ids) or not all(0 <= b < self._num_blocks for b in block_ids):
            raise InvalidArgumentError("dst_block_ids", f"must be distinct ids in [0, {self._num_blocks})")
        if not lease_s > 0:
            raise InvalidArgumentError("lease_s", f"must be > 0, got {lease_s}")
        with self._cond:
            if transfer_id in self._live:
                raise TransferStateError(f"transfer {transfer_id!r} is already reserved")
            self._ended.pop(transfer_id, None)
            deadline = time.monotonic() + lease_s
            self._live[transfer_id] = _Reservation(transfer_id, block_ids, lease_s, deadline, fence=fence)

    def state(self, transfer_id: str) -> TransferState:
        with self._cond:
            return self._state_locked(transfer_id)

    def wait(self, transfer_id: str, timeout_s: float) -> TransferState:
        with self._cond:
            self._cond.wait_for(lambda: self._state_locked(transfer_id).is_final, timeout_s)
            return self._state_locked(transfer_id)

    def claim(self, transfer_id: str) -> None:
        now = time.monotonic()
        with self._cond:
            reservation = self._live.get(transfer_id)
            self._expire_if_lapsed_locked(reservation, now)
            if reservation is None or reservation.state is not TransferState.DONE:
                raise self._not_writable_error(transfer_id, reservation, "claim")
            del self._live[transfer_id]
            self._cond.notify_all()

    def abort(self, transfer_id: str) -> None:
        with self._cond:
            reservation = self._live.get(transfer_id)
            if reservation is not None and not reservation.writes:
                self._release_locked(reservation, TransferState.ABORTED)
            elif reservation is not None and not reservation.state.is_final:
                self._mark_locked(reservation, TransferState.ABORTED)

    def abort_all(self) -> None:
        with self._cond:
            for transfer_id in list(self._live):
                self.abort(transfer_id)

    def begin_chunk(self, transfer_id: str, dst_block_ids: Sequence[int]) -> Fence:
        """Admit a chunk for writing, or raise the TransferError to send back (nothing may be written then); the
        reservation's fence, which the writes wait for."""
        now = time.monotonic()
        with self._cond:
            reservation = self._live.get(transfer_id)
            self._expire_if_lapsed_locked(reservation, now)
            if reservation is None or reservation.state.is_final:
                raise self._not_writable_error(transfer_id, reservation, "write")
            foreign = set(dst_block_ids) - reservation.block_ids
            if foreign or len(set(dst_block_ids)) != len(dst_block_ids):
                self._end_locked(reservation, TransferState.FAILED)
                raise InvalidChunkError(
                    f"chunk of {transfer_id!r} repeats blocks or names unreserved ones {sorted(foreign)}: "
                    f"{list(dst_block_ids)}"
                )
            reservation.writes += 1
            reservation.deadline = now + reservation.lease_s
            self._mark_locked(reservation, TransferState.TRANSFERRING)
            return reservation.fence

    def is_writable(self, transfer_id: str) -> bool:
        """False once a chunk being written should be abandoned (its reservation expired or was aborted)."""
        with self._cond:
            reservation = self._live.get(transfer_id)
            return reservation is not None and reservation.state is TransferState.TRANSFERRING

    def end_chunk(
        self, transfer_id: str, dst_block_ids: Sequence[int], last: bool, complete: bool
    ) -> TransferError | None:
        """Close a write opened by `begin_chunk`; returns the error to send back instead of an ack, if any.
        `complete` is False when the bytes did not all arrive: the reservation fails."""
        with self._cond:
            reservation = self._live[transfer_id]
            reservation.writes -= 1
            if reservation.state.is_final:
                state = reservation.state
                self._end_locked(reservation, state)
                return _ENDED_ERRORS[state](f"transfer {transfer_id!r} {state.value} during a write")
            if not complete:
                self._end_locked(reservation, TransferState.FAILED)
                return TransportError(f"chunk of transfer {transfer_id!r} was cut short")
            reservation.received.update(dst_block_ids)
            reservation.deadline = time.monotonic() + reservation.lease_s
            missing = reservation.block_ids - reservation.received
            if last and (missing or reservation.writes):
                self._end_locked(reservation, TransferState.FAILED)
                return InvalidChunkError(f"last chunk of {transfer_id!r} leaves blocks {sorted(missing)} unwritten")
            if last:
                reservation.deadline = time.monotonic() + min(reservation.lease_s, self._claim_window_s)
                self._mark_locked(reservation, TransferState.DONE)
            return None

    def reap(self) -> None:
        """Expire every reservation whose lease lapsed (one being written is marked now and released by end_chunk)."""
        now = time.monotonic()
        with self._cond:
            for reservation in list(self._live.values()):
                if reservation.deadline >= now or reservation.state in (TransferState.EXPIRED, TransferState.ABORTED):
                    continue
                self._end_locked(reservation, TransferState.EXPIRED)

    def _expire_if_lapsed_locked(self, reservation: _Reservation | None, now: float) -> None:
        """A lapsed lease counts even before the reaper gets to it."""
        if reservation is not None and not reservation.writes and now > reservation.deadline:
            self._release_locked(reservation, TransferState.EXPIRED)

    def _state_locked(self, transfer_id: str) -> TransferState:
        reservation = self._live.get(transfer_id)
        if reservation is not None:
            return reservation.state
        ended = self._ended.get(transfer_id)
        if ended is None:
            raise UnknownTransferError(f"no reservation for transfer {transfer_id!r}")
        return ended

    def _not_writable_error(self, transfer_id: str, reservation: _Reservation | None, action: str) -> TransferError:
        state = reservation.state if reservation is not None else self._ended.get(transfer_id)
        if state is None:
            return UnknownTransferError(f"cannot {action} transfer {transfer_id!r}: no such reservation")
        if reservation is not None and reservation.writes and not state.is_final:
            return TransferStateError(f"cannot {action} transfer {transfer_id!r}: a chunk is being written")
        return _ENDED_ERRORS.get(state, TransferStateError)(f"cannot {action} transfer {transfer_id!r}: {state.value}")

    def _mark_locked(self, reservation: _Reservation, state: TransferState) -> None:
        reservation.state = state
        self._cond.notify_all()

    def _end_locked(self, reservation: _Reservation, state: TransferState) -> None:
        """End the reservation in `state`: released now, or marked and released by the last open write's end."""
        if reservation.writes:
            self._mark_locked(reservation, state)
        else:
            self._release_locked(reservation, state)

    def _release_locked(self, reservation: _Reservation, state: TransferState) -> None:
        reservation.state = state
        del self._live[reservation.transfer_id]
        self._ended[reservation.transfer_id] = state
        while len(self._ended) > self._max_ended:
            self._ended.popitem(last=False)
        self._cond.notify_all()
        self._notify(reservation.transfer_id, state)


class ReservationReceiver(KVReceiver):
    """A receiver whose reservations live in a ReservationTable: the lifecycle calls are the table's, and released
    reservations reach `on_released` through the receiver's housekeeper. Subclasses set `_table` (built with
    `_post_released` as its notify) and `_housekeeper` in their constructor."""

    _table: ReservationTable
    _housekeeper: Housekeeper

    def expect(self, transfer_id: str, dst_block_ids: Sequence[int], lease_s: float) -> None:
        self._table.expect(transfer_id, dst_block_ids, lease_s)

    def state(self, transfer_id: str) -> TransferState:
        return self._table.state(transfer_id)

    def wait(self, transfer_id: str, timeout_s: float) -> TransferState:
        return self._table.wait(transfer_id, timeout_s)

    def claim(self, transfer_id: str) -> None:
        self._table.claim(transfer_id)

    def abort(self, transfer_id: str) -> None:
        self._table.abort(transfer_id)

    def _post_released(self, transfer_id: str, state: TransferState) -> None:
        self._housekeeper.post(lambda: self.on_released(transfer_id, state))
