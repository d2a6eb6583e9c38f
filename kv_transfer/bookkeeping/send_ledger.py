"""Prefill-side bookkeeping shared by every sender backend: transfer records, leases renewed by acks, stats."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from common.errors import InvalidArgumentError
from kv_transfer.base import TransferStats
from kv_transfer.layout import KVLayout, check_transfer_layouts
from kv_transfer.state import (
    LayoutMismatchError,
    TransferAbortedError,
    TransferError,
    TransferExpiredError,
    TransferState,
    TransferStateError,
    UnknownTransferError,
)


@dataclass(slots=True, eq=False)
class _Transfer:
    transfer_id: str
    endpoint: str
    started_at: float
    deadline: float
    state: TransferState = TransferState.TRANSFERRING
    ended_at: float | None = None
    num_bytes: int = 0
    num_blocks: int = 0
    num_chunks: int = 0
    last_sent: bool = False
    error: TransferError | None = None

    def stats(self, now: float) -> TransferStats:
        end = self.ended_at if self.ended_at is not None else now
        return TransferStats(
            self.transfer_id,
            self.state,
            self.num_bytes,
            self.num_blocks,
            self.num_chunks,
            end - self.started_at,
            self.error,
        )


class SendLedger:
    """Thread-safe records of one sender's transfers. `notify(transfer_id, state)` is called (under the lock, so it
    must only enqueue) once per transfer, when it ends. Ended records are kept (bounded) for state() and stats()."""

    def __init__(self, lease_s: float, notify: Callable[[str, TransferState], None], max_ended: int = 4096) -> None:
        if not lease_s > 0:
            raise InvalidArgumentError("lease_s", f"must be > 0, got {lease_s}")
        self._lease_s = lease_s
        self._notify = notify
        self._max_ended = max_ended
        self._cond = threading.Condition()
        self._transfers: dict[str, _Transfer] = {}
        self._ended: OrderedDict[str, _Transfer] = OrderedDict()

    def open_chunk(self, transfer_id: str, endpoint: str, last: bool) -> bool:
        """Count a chunk about to be queued; False when the transfer already ended (drop the chunk)."""
        now = time.monotonic()
        with self._cond:
            transfer = self._transfers.get(transfer_id)
            if transfer is None and transfer_id in self._ended:
                return False
            if transfer is None:
                transfer = _Transfer(transfer_id, endpoint, now, now + self._lease_s)
                self._transfers[transfer_id] = transfer
            if transfer.endpoint != endpoint:
                raise InvalidArgumentError("endpoint", f"transfer {transfer_id!r} goes to {transfer.endpoint!r}")
            if transfer.last_sent:
                raise TransferStateError(f"transfer {transfer_id!r} already sent its last chunk")
            transfer.last_sent = last
            transfer.num_chunks += 1
            return True

    def fail_new(self, transfer_id: str, endpoint: str, error: TransferError) -> None:
        """End a transfer that fails before its first chunk is queued (e.g. a local layout mismatch)."""
        with self._cond:
            self._open_unsent_locked(transfer_id, endpoint)
            self._end_locked(transfer_id, error.ends_in, error)

    def check_layout(self, transfer_id: str, endpoint: str, ours: KVLayout, theirs: KVLayout) -> bool:
        """False, with the transfer failed (LayoutMismatchError), when the receiver's layout differs from ours."""
        try:
            check_transfer_layouts(ours, theirs)
        except LayoutMismatchError as error:
            self.fail_new(transfer_id, endpoint, error)
            return False
        return True

    def ack(self, transfer_id: str, num_bytes: int, num_blocks: int, last: bool) -> None:
        """The receiver wrote a chunk: renew the lease, count it, and end DONE after the last one."""
        with self._cond:
            transfer = self._transfers.get(transfer_id)
            if transfer is None:
                return
            transfer.deadline = time.monotonic() + self._lease_s
            transfer.num_bytes += num_bytes
            transfer.num_blocks += num_blocks
            if last:
                self._end_locked(transfer_id, TransferState.DONE, None)

    def fail(self, transfer_id: str, error: TransferError) -> None:
        with self._cond:
            self._end_locked(transfer_id, error.ends_in, error)

    def abort(self, transfer_id: str, endpoint: str | None = None) -> str | None:
        """End a transfer ABORTED; returns the endpoint to tell the receiver at, None if it already ended.

        A transfer that sent no chunk yet is unknown here: with `endpoint` (its receiver) it is recorded, then ended,
        like a live one; without, nothing happens (None).
        NOTE: the receiver of a transfer aborted before its first chunk holds the reservation all the same, so it
        must still be told; the record makes a late chunk of that transfer a dropped one.
        """
        with self._cond:
            if endpoint is not None:
                self._open_unsent_locked(transfer_id, endpoint)
            transfer = self._transfers.get(transfer_id)
            if transfer is None:
                return None
            self._end_locked(transfer_id, TransferState.ABORTED, TransferAbortedError("aborted by the sender"))
            return transfer.endpoint

    def live_ids(self) -> list[str]:
        with self._cond:
            return list(self._transfers)

    def is_live(self, transfer_id: str) -> bool:
        with self._cond:
            return transfer_id in self._transfers

    def reap(self) -> list[tuple[str, str]]:
        """End EXPIRED every transfer whose lease lapsed without an ack; returns their (transfer_id, endpoint)."""
        now = time.monotonic()
        with self._cond:
            expired = [t for t in self._transfers.values() if t.deadline < now]
            for transfer in expired:
                error = TransferExpiredError(f"no ack for transfer {transfer.transfer_id!r} within {self._lease_s}s")
                self._end_locked(transfer.transfer_id, TransferState.EXPIRED, error)
            return [(t.transfer_id, t.endpoint) for t in expired]

    def state(self, transfer_id: str) -> TransferState:
        with self._cond:
            return self._get_locked(transfer_id).state

    def wait(self, transfer_id: str, timeout_s: float) -> TransferState:
        with self._cond:
            self._cond.wait_for(lambda: self._get_locked(transfer_id).state.is_final, timeout_s)
            return self._get_locked(transfer_id).state

    def stats(self, transfer_id: str) -> TransferStats:
        now = time.monotonic()
        with self._cond:
            return self._get_locked(transfer_id).stats(now)

    def _open_unsent_locked(self, transfer_id: str, endpoint: str) -> None:
        """Record a transfer that has no chunk yet (a no-op for one live or ended)."""
        if transfer_id not in self._transfers and transfer_id not in self._ended:
            now = time.monotonic()
            self._transfers[transfer_id] = _Transfer(transfer_id, endpoint, now, now + self._lease_s)

    def _get_locked(self, transfer_id: str) -> _Transfer:
        transfer = self._transfers.get(transfer_id) or self._ended.get(transfer_id)
        if transfer is None:
            raise UnknownTransferError(f"transfer {transfer_id!r} was never sent")
        return transfer

    def _end_locked(self, transfer_id: str, state: TransferState, error: TransferError | None) -> None:
        transfer = self._transfers.pop(transfer_id, None)
        if transfer is None:
            return
        transfer.state = state
        transfer.error = error
        transfer.ended_at = time.monotonic()
        self._ended[transfer_id] = transfer
        while len(self._ended) > self._max_ended:
            self._ended.popitem(last=False)
        self._cond.notify_all()
        self._notify(transfer_id, state)
