"""KV transfer between parallel pods: one backend sender or receiver per rank behind the one interface.

A TP x PP pod holds its KV as one pool per rank (`KVPoolView.rank`: its stage's layers, its share of the KV heads).
Lifecycle of one transfer between two pods of the same sizes (every backend alike):
1. decode: `RankedReceiver.expect` reserves the same block ids in every rank's receiver under the one transfer id.
   Its `endpoint` lists the ranks' endpoints in rank order (`join_endpoints`) and its `layout` is rank 0's, so the
   KV target (one per request, as for a one-device pod) carries both.
2. prefill: the pod checks the target's layout first (`check_transfer_layouts`): pods of other TP/PP sizes are
   refused there, naming both sizes, before anything is sent. `RankedSender.send` then hands each rank's sender the
   chunk (the same block ids, read from its own pool) for the same rank's receiver: N x M transfers under one id.
   Each rank's first contact with its peer compares their layouts, rank and sizes included.
3. ends (`kv_transfer.bookkeeping.rank_join`): DONE once every rank's transfer is; the first rank that ends
   otherwise aborts the others, and the hook (`on_finished` / `on_released`) fires once, after the last rank ended.
   `claim` claims every rank.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import TypeVar

from common.errors import InvalidArgumentError
from kv_transfer.base import KVReceiver, KVSender, TransferHook, TransferStats, ignore_hook
from kv_transfer.bookkeeping.rank_join import RankJoin, combine_states
from kv_transfer.layout import KVLayout
from kv_transfer.state import TransferState

ENDPOINT_SEPARATOR = ","

End = TypeVar("End", KVSender, KVReceiver)


def join_endpoints(endpoints: Sequence[str]) -> str:
    """One endpoint naming every rank's receiver, in rank order."""
    return ENDPOINT_SEPARATOR.join(endpoints)


def split_endpoints(endpoint: str, num_ranks: int) -> list[str]:
    """The ranks' endpoints of `join_endpoints`; InvalidArgumentError("endpoint") unless it names `num_ranks`."""
    endpoints = endpoint.split(ENDPOINT_SEPARATOR)
    if len(endpoints) != num_ranks:
        raise InvalidArgumentError(
            "endpoint", f"names {len(endpoints)} rank receivers, this pod has {num_ranks} ranks: {endpoint!r}"
        )
    return endpoints


def _rank_hook(join: RankJoin, rank: int) -> TransferHook:
    return lambda transfer_id, state: join.end(transfer_id, rank, state)


def _rank_layout(theirs: KVLayout, ours: KVLayout) -> KVLayout:
    """The receiver's layout for our rank, from its rank 0's: the same sizes, dtype and block shape but for the
    rank's place and its stage's layers. NOTE: stages split the layers by the rule both pods share (checked by each
    rank's handshake, which compares the real layouts). A layout of other sizes is passed on as it is: the rank's own
    check then fails the transfer, naming the sizes."""
    if (theirs.tp_size, theirs.pp_size) != (ours.tp_size, ours.pp_size):
        return theirs
    return dataclasses.replace(theirs, num_layers=ours.num_layers, tp_rank=ours.tp_rank, pp_rank=ours.pp_rank)


class RankedSender(KVSender):
    """The prefill side of a parallel pod: `senders[r]` ships rank r's pool (rank order: `KVRank.world_rank`)."""

    def __init__(self, senders: Sequence[KVSender], on_finished: TransferHook = ignore_hook) -> None:
        self._senders = list(senders)
        self.layout = self._senders[0].layout
        self.on_finished = on_finished
        self._join = RankJoin(len(self._senders), self._abort_rank, self._report)
        for rank, sender in enumerate(self._senders):
            sender.on_finished = _rank_hook(self._join, rank)

    def send(
        self,
        transfer_id: str,
        endpoint: str,
        layout: KVLayout,
        src_block_ids: Sequence[int],
        dst_block_ids: Sequence[int],
        last: bool,
    ) -> None:
        endpoints = split_endpoints(endpoint, len(self._senders))
        self._join.open(transfer_id)
        for sender, rank_endpoint in zip(self._senders, endpoints, strict=True):
            rank_layout = _rank_layout(layout, sender.layout)
            sender.send(transfer_id, rank_endpoint, rank_layout, src_block_ids, dst_block_ids, last)

    def state(self, transfer_id: str) -> TransferState:
        ended = self._join.ended_state(transfer_id)
        if ended is not None:
            return ended
        return combine_states((s.state(transfer_id) for s in self._senders), TransferState.TRANSFERRING)

    def wait(self, transfer_id: str, timeout_s: float) -> TransferState:
        _wait_ranks(self._senders, transfer_id, timeout_s)
        return self.state(transfer_id)

    def abort(self, transfer_id: str, endpoint: str | None = None) -> None:
        if endpoint is None:
            for sender in self._senders:
                sender.abort(transfer_id)
            return
        self._join.open(transfer_id)
        for sender, rank_endpoint in zip(self._senders, split_endpoints(endpoint, len(self._senders)), strict=True):
            sender.abort(transfer_id, rank_endpoint)

    def stats(self, transfer_id: str) -> TransferStats:
        """Bytes of every rank; blocks and chunks that every rank had acked; the longest duration; the first error."""
        ranks = [s.stats(transfer_id) for s in self._senders]
        error = next((r.error for r in ranks if r.error is not None), None)
        return TransferStats(
            transfer_id,
            self.state(transfer_id),
            sum(r.num_bytes for r in ranks),
            min(r.num_blocks for r in ranks),
            min(r.num_chunks for r in ranks),
            max(r.duration_s for r in ranks),
            error,
        )

    def close(self) -> None:
        for sender in self._senders:
            sender.close()

    def _abort_rank(self, rank: int, transfer_id: str) -> None:
        self._senders[rank].abort(transfer_id)

    def _report(self, transfer_id: str, state: TransferState) -> None:
        self.on_finished(transfer_id, state)


class RankedReceiver(KVReceiver):
    """The decode side of a parallel pod: `receivers[r]` writes rank r's pool (rank order: `KVRank.world_rank`)."""

    def __init__(self, receivers: Sequence[KVReceiver], on_released: TransferHook = ignore_hook) -> None:
        self._receivers = list(receivers)
        self.layout = self._receivers[0].layout
        self.on_released = on_released
        self._join = RankJoin(len(self._receivers), self._abort_rank, self._report)
        for rank, receiver in enumerate(self._receivers):
            receiver.on_released = _rank_hook(self._join, rank)

    @property
    def endpoint(self) -> str:
        return join_endpoints([r.endpoint for r in self._receivers])

    def expect(self, transfer_id: str, dst_block_ids: Sequence[int], lease_s: float) -> None:
        opened = self._join.open(transfer_id, anew=True)
        expected: list[KVReceiver] = []
        try:
            for receiver in self._receivers:
                receiver.expect(transfer_id, dst_block_ids, lease_s)
                expected.append(receiver)
        except BaseException:
            # NOTE: the caller gets the error and keeps its blocks; the ranks reserved so far end unreported. A live
            # reservation of the same id (every rank refuses it) stays as it is.
            if opened:
                self._join.discard(transfer_id)
            for receiver in expected:
                receiver.abort(transfer_id)
            raise

    def state(self, transfer_id: str) -> TransferState:
        ended = self._join.ended_state(transfer_id)
        if ended is not None:
            return ended
        return combine_states((r.state(transfer_id) for r in self._receivers), TransferState.RESERVED)

    def wait(self, transfer_id: str, timeout_s: float) -> TransferState:
        _wait_ranks(self._receivers, transfer_id, timeout_s)
        return self.state(transfer_id)

    def claim(self, transfer_id: str) -> None:
        """Claim every rank in order. A rank that cannot be claimed raises its error and aborts the ranks after it;
        the blocks are then released through `on_released`, as for a one-device pod."""
        for rank, receiver in enumerate(self._receivers):
            try:
                receiver.claim(transfer_id)
            except BaseException:
                for later in self._receivers[rank + 1 :]:
                    later.abort(transfer_id)
                raise
            self._join.settle(transfer_id, rank)

    def abort(self, transfer_id: str) -> None:
        for receiver in self._receivers:
            receiver.abort(transfer_id)

    def close(self) -> None:
        for receiver in self._receivers:
            receiver.close()

    def _abort_rank(self, rank: int, transfer_id: str) -> None:
        self._receivers[rank].abort(transfer_id)

    def _report(self, transfer_id: str, state: TransferState) -> None:
        self.on_released(transfer_id, state)


def _wait_ranks(ends: Sequence[KVSender] | Sequence[KVReceiver], transfer_id: str, timeout_s: float) -> None:
    """Wait for every rank's transfer to end, within one shared timeout."""
    deadline = time.monotonic() + timeout_s
    for end in ends:
        end.wait(transfer_id, max(0.0, deadline - time.monotonic()))
