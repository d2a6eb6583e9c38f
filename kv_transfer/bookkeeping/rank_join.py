"""How the per-rank transfers of one parallel transfer end together (`kv_transfer.ranked`'s bookkeeping).

Every rank of a parallel pod moves its slice of a request's KV under the one transfer id. The transfer ends once
every rank's has: DONE if each did, else the state of the first rank that ended otherwise, which aborts the other
ranks at once. The hook of the transfer fires once, after the last rank ended, so the blocks (the same ids in every
rank's pool) are freed only when no rank reads or writes them any more.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable

from kv_transfer.base import TransferHook
from kv_transfer.state import TransferState

AbortRank = Callable[[int, str], None]
"""abort_rank(rank, transfer_id): end the rank's transfer now (its hook still reports the end)."""


def combine_states(states: Iterable[TransferState], pending: TransferState) -> TransferState:
    """The state of a parallel transfer from its ranks' states: the first failure in rank order, DONE when every rank
    is, else TRANSFERRING once a rank moved bytes, else `pending` (what an untouched rank reports)."""
    states = list(states)
    failed = [s for s in states if s.is_final and s is not TransferState.DONE]
    if failed:
        return failed[0]
    if all(s is TransferState.DONE for s in states):
        return TransferState.DONE
    if any(s in (TransferState.TRANSFERRING, TransferState.DONE) for s in states):
        return TransferState.TRANSFERRING
    return pending


class RankJoin:
    """Thread-safe: per transfer id, the ranks whose transfer has not ended, and the first failure. `report(transfer_id,
    state)` runs once per opened transfer (on the thread of the last rank's hook) unless every rank was settled
    quietly (a claim)."""

    def __init__(self, num_ranks: int, abort_rank: AbortRank, report: TransferHook, max_ended: int = 4096) -> None:
        self._num_ranks = num_ranks
        self._abort_rank = abort_rank
        self._report = report
        self._max_ended = max_ended
        self._lock = threading.Lock()
        self._live: dict[str, set[int]] = {}
        self._failures: dict[str, TransferState] = {}
        # NOTE: ended ids are remembered (bounded) so that a late rank hook or a repeated open cannot revive them.
        self._ended: OrderedDict[str, TransferState] = OrderedDict()

    def open(self, transfer_id: str, anew: bool = False) -> bool:
        """Track the transfer's ranks; False (a no-op) for a live transfer, and for an ended one unless `anew` (a
        receiver's reservation may reuse the id of one that ended, as its ranks' tables let it)."""
        with self._lock:
            if anew:
                self._ended.pop(transfer_id, None)
            if transfer_id in self._live or transfer_id in self._ended:
                return False
            self._live[transfer_id] = set(range(self._num_ranks))
            return True

    def discard(self, transfer_id: str) -> None:
        """Forget a transfer that never started (its ranks' later hooks are ignored)."""
        with self._lock:
            self._live.pop(transfer_id, None)
            self._failures.pop(transfer_id, None)

    def ended_state(self, transfer_id: str) -> TransferState | None:
        """The state the transfer ended in, the first rank failure of a live one, or None."""
        with self._lock:
            return self._ended.get(transfer_id) or self._failures.get(transfer_id)

    def end(self, transfer_id: str, rank: int, state: TransferState) -> None:
        """A rank's hook: its transfer ended in `state`. The first failure aborts the other ranks; the last end
        reports."""
        with self._lock:
            ranks = self._live.get(transfer_id)
            if ranks is None or rank not in ranks:
                return
            ranks.discard(rank)
            to_abort: set[int] = set()
            if state is not TransferState.DONE and transfer_id not in self._failures:
                self._failures[transfer_id] = state
                to_abort = set(ranks)
            final = self._finish_locked(transfer_id) if not ranks else None
        for other in sorted(to_abort):
            self._abort_rank(other, transfer_id)
        if final is not None:
            self._report(transfer_id, final)

    def settle(self, transfer_id: str, rank: int) -> None:
        """A rank's transfer ended DONE without a hook (claimed). If that was the last rank, the transfer ends: quietly,
        unless another rank failed meanwhile (then that failure is reported)."""
        with self._lock:
            ranks = self._live.get(transfer_id)
            if ranks is None:
                return
            ranks.discard(rank)
            final = self._finish_locked(transfer_id) if not ranks else None
        if final is not None and final is not TransferState.DONE:
            self._report(transfer_id, final)

    def _finish_locked(self, transfer_id: str) -> TransferState:
        del self._live[transfer_id]
        final = self._failures.pop(transfer_id, TransferState.DONE)
        self._ended[transfer_id] = final
        while len(self._ended) > self._max_ended:
            self._ended.popitem(last=False)
        return final
