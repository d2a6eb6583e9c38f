"""The in-process backend: sender and receiver in one process, for contract tests and the colocated mode.

Receivers register under "inproc://<name>" in a process-wide registry. Each sender has one worker thread that
delivers its chunks in order by calling the receiver directly; a delivery that returns is the chunk's ack.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kv_transfer.base import KVSender, TransferHook, TransferStats, check_send_args, ignore_hook
from kv_transfer.bookkeeping.housekeeper import Housekeeper
from kv_transfer.bookkeeping.reservation_table import ReservationReceiver, ReservationTable
from kv_transfer.bookkeeping.send_ledger import SendLedger
from kv_transfer.layout import KVLayout, KVRank, check_transfer_layouts
from kv_transfer.pool_io import gather_blocks, pool_bytes, write_blocks
from kv_transfer.state import TransferError, TransferState, TransportError

ENDPOINT_PREFIX = "inproc://"

_registry_lock = threading.Lock()
_registry: dict[str, InProcessReceiver] = {}


def _lookup(endpoint: str) -> InProcessReceiver:
    with _registry_lock:
        receiver = _registry.get(endpoint)
    if receiver is None:
        raise TransportError(f"no in-process KV receiver at {endpoint!r}")
    return receiver


class InProcessReceiver(ReservationReceiver):
    """Receives chunks by direct calls from in-process senders into `pool`."""

    def __init__(
        self,
        pool: torch.Tensor,
        block_size: int,
        name: str | None = None,
        on_released: TransferHook = ignore_hook,
        reap_interval_s: float = 0.05,
        rank: KVRank | None = None,
    ) -> None:
        self.layout = KVLayout.from_pool(pool, block_size, rank=rank)
        self.on_released = on_released
        self._rows = pool_bytes(pool)
        self._endpoint = ENDPOINT_PREFIX + (name or uuid.uuid4().hex)
        self._table = ReservationTable(pool.shape[0], self._post_released)
        with _registry_lock:
            if self._endpoint in _registry:
                raise TransportError(f"an in-process KV receiver already serves {self._endpoint!r}")
            _registry[self._endpoint] = self
        # NOTE: started after registering, so a failed construction leaves no thread behind; nothing is posted
        # before the owner's first expect().
        self._housekeeper = Housekeeper(f"kv-receiver-{self._endpoint}", self._table.reap, reap_interval_s)

    @property
    def endpoint(self) -> str:
        return self._endpoint

    def close(self) -> None:
        with _registry_lock:
            if _registry.get(self._endpoint) is self:
                del _registry[self._endpoint]
        self._table.abort_all()
        self._housekeeper.stop()

    def deliver(self, transfer_id: str, dst_block_ids: Sequence[int], blocks: np.ndarray, last: bool) -> None:
        """Write one chunk (host rows) into the reserved blocks; raises the TransferError that rejects it."""
        self._table.begin_chunk(transfer_id, dst_block_ids)
        complete = False
        try:
            write_blocks(self._rows, dst_block_ids, blocks)
            complete = True
        finally:
            error = self._table.end_chunk(transfer_id, dst_block_ids, last, complete)
        if error is not None:
            raise error


@dataclass(frozen=True, slots=True)
class _Chunk:
    transfer_id: str
    endpoint: str
    dst_block_ids: tuple[int, ...]
    blocks: np.ndarray
    last: bool


@dataclass(frozen=True, slots=True)
class _Abort:
    transfer_id: str
    endpoint: str


class InProcessSender(KVSender):
    """Ships blocks of `pool` to in-process receivers from one worker thread."""

    def __init__(
        self,
        pool: torch.Tensor,
        block_size: int,
        lease_s: float = 30.0,
        on_finished: TransferHook = ignore_hook,
        reap_interval_s: float = 0.05,
        rank: KVRank | None = None,
    ) -> None:
        self.layout = KVLayout.from_pool(pool, block_size, rank=rank)
        self.on_finished = on_finished
        self._rows = pool_bytes(pool)
        self._ledger = SendLedger(lease_s, self._post_finished)
        self._peers: dict[str, InProcessReceiver] = {}
        self._queue: queue.SimpleQueue[_Chunk | _Abort | None] = queue.SimpleQueue()
        self._housekeeper = Housekeeper("kv-sender-inproc", self._reap, reap_interval_s)
        self._worker = threading.Thread(target=self._run, name="kv-sender-inproc-worker", daemon=True)
        self._worker.start()

    def send(
        self,
        transfer_id: str,
        endpoint: str,
        layout: KVLayout,
        src_block_ids: Sequence[int],
        dst_block_ids: Sequence[int],
        last: bool,
    ) -> None:
        check_send_args(transfer_id, src_block_ids, dst_block_ids, self._rows.shape[0])
        if not self._ledger.check_layout(transfer_id, endpoint, self.layout, layout):
            return
        blocks = gather_blocks(self._rows, src_block_ids)
        if self._ledger.open_chunk(transfer_id, endpoint, last):
            self._queue.put(_Chunk(transfer_id, endpoint, tuple(dst_block_ids), blocks, last))

    def state(self, transfer_id: str) -> TransferState:
        return self._ledger.state(transfer_id)

    def wait(self, transfer_id: str, timeout_s: float) -> TransferState:
        return self._ledger.wait(transfer_id, timeout_s)

    def abort(self, transfer_id: str, endpoint: str | None = None) -> None:
        to_tell = self._ledger.abort(transfer_id, endpoint)
        if to_tell is not None:
            self._queue.put(_Abort(transfer_id, to_tell))

    def stats(self, transfer_id: str) -> TransferStats:
        return self._ledger.stats(transfer_id)

    def close(self) -> None:
        for transfer_id in self._ledger.live_ids():
            self.abort(transfer_id)
        self._queue.put(None)
        self._worker.join(5.0)
        self._housekeeper.stop()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if isinstance(item, _Abort):
                self._notify_abort(item.transfer_id, item.endpoint)
            elif self._ledger.is_live(item.transfer_id):
                self._deliver(item)

    def _deliver(self, chunk: _Chunk) -> None:
        try:
            self._peer(chunk.endpoint).deliver(chunk.transfer_id, chunk.dst_block_ids, chunk.blocks, chunk.last)
        except TransferError as error:
            self._ledger.fail(chunk.transfer_id, error)
            return
        self._ledger.ack(chunk.transfer_id, chunk.blocks.nbytes, len(chunk.dst_block_ids), chunk.last)

    def _peer(self, endpoint: str) -> InProcessReceiver:
        """The receiver at `endpoint`; the first contact with it checks its layout."""
        receiver = _lookup(endpoint)
        if self._peers.get(endpoint) is not receiver:
            check_transfer_layouts(self.layout, receiver.layout)
            self._peers[endpoint] = receiver
        return receiver

    def _notify_abort(self, transfer_id: str, endpoint: str) -> None:
        with contextlib.suppress(TransportError):
            _lookup(endpoint).abort(transfer_id)

    def _reap(self) -> None:
        for transfer_id, endpoint in self._ledger.reap():
            self._queue.put(_Abort(transfer_id, endpoint))

    def _post_finished(self, transfer_id: str, state: TransferState) -> None:
        self._housekeeper.post(lambda: self.on_finished(transfer_id, state))
