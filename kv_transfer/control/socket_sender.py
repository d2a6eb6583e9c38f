"""The sender of every socket backend: one persistent control connection per receiver endpoint, reused across
transfers; the backend's data plane (`kv_transfer.control.data_plane`) moves each chunk's bytes. With an
`ssl_context` (`common.tls.kv_client_context`) each connection is mutual TLS: this sender shows its certificate and
checks the receiver's against the cluster CA."""

from __future__ import annotations

import ssl
import threading
from abc import abstractmethod
from collections.abc import Sequence
from typing import Generic

import torch

from kv_transfer.base import KVSender, TransferHook, TransferStats, check_send_args, ignore_hook
from kv_transfer.bookkeeping.housekeeper import Housekeeper
from kv_transfer.bookkeeping.send_ledger import SendLedger
from kv_transfer.control.address import parse_endpoint
from kv_transfer.control.data_plane import SenderPlane, Staged
from kv_transfer.control.sender_connection import Outgoing, OutgoingAbort, OutgoingChunk, SenderConnection
from kv_transfer.layout import KVLayout, KVRank
from kv_transfer.state import TransferState, TransportError


class SocketSender(KVSender, Generic[Staged]):
    """Ships blocks of `pool` through the data plane that a backend's subclass makes (`_make_plane`). `send` stages
    the chunk (the plane's capture of it) and queues it; the connection's threads do the I/O. `lease_s` bounds how
    long a transfer waits for its next ack (and each socket write)."""

    def __init__(
        self,
        pool: torch.Tensor,
        block_size: int,
        lease_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        on_finished: TransferHook = ignore_hook,
        reap_interval_s: float = 0.05,
        ssl_context: ssl.SSLContext | None = None,
        rank: KVRank | None = None,
    ) -> None:
        self.layout = KVLayout.from_pool(pool, block_size, rank=rank)
        self.on_finished = on_finished
        self._num_blocks = pool.shape[0]
        self._lease_s = lease_s
        self._connect_timeout_s = connect_timeout_s
        self._ssl_context = ssl_context
        self._plane = self._make_plane(pool)
        self._ledger = SendLedger(lease_s, self._post_finished)
        self._lock = threading.Lock()
        self._connections: dict[str, SenderConnection[Staged]] = {}
        self._num_opened = 0
        self._housekeeper = Housekeeper(f"kv-sender-{self._plane.backend}", self._reap, reap_interval_s)

    @abstractmethod
    def _make_plane(self, pool: torch.Tensor) -> SenderPlane[Staged]:
        """The backend's data plane over `pool` (called once, by the constructor)."""

    def send(
        self,
        transfer_id: str,
        endpoint: str,
        layout: KVLayout,
        src_block_ids: Sequence[int],
        dst_block_ids: Sequence[int],
        last: bool,
    ) -> None:
        check_send_args(transfer_id, src_block_ids, dst_block_ids, self._num_blocks)
        parse_endpoint(endpoint)
        if not self._ledger.check_layout(transfer_id, endpoint, self.layout, layout):
            return
        staged = self._plane.stage(src_block_ids)
        if not self._ledger.open_chunk(transfer_id, endpoint, last):
            return
        if not self._submit(endpoint, OutgoingChunk(transfer_id, tuple(dst_block_ids), staged, last), reconnect=True):
            self._ledger.fail(transfer_id, TransportError(f"no connection to {endpoint}"))

    def state(self, transfer_id: str) -> TransferState:
        return self._ledger.state(transfer_id)

    def wait(self, transfer_id: str, timeout_s: float) -> TransferState:
        return self._ledger.wait(transfer_id, timeout_s)

    def abort(self, transfer_id: str, endpoint: str | None = None) -> None:
        to_tell = self._ledger.abort(transfer_id, endpoint)
        # NOTE: reconnect: a transfer aborted before its first chunk may have no connection yet, and its receiver
        # holds the reservation until told; connecting is bounded by connect_timeout_s.
        if to_tell is not None:
            self._submit(to_tell, OutgoingAbort(transfer_id), reconnect=True)

    def stats(self, transfer_id: str) -> TransferStats:
        return self._ledger.stats(transfer_id)

    @property
    def num_connections(self) -> int:
        """Connections opened so far (one per receiver endpoint while it stays up)."""
        with self._lock:
            return self._num_opened

    def close(self) -> None:
        for transfer_id in self._ledger.live_ids():
            self.abort(transfer_id)
        with self._lock:
            connections = list(self._connections.values())
            self._connections.clear()
        for connection in connections:
            connection.close()
        self._housekeeper.stop()
        self._plane.close()

    def _submit(self, endpoint: str, item: Outgoing[Staged], reconnect: bool) -> bool:
        """Queue `item` on the endpoint's connection; with `reconnect`, open a new one if it died (or none is)."""
        for _ in range(2):
            with self._lock:
                connection = self._connections.get(endpoint)
                if (connection is None or connection.closed) and reconnect:
                    connection = SenderConnection(
                        endpoint,
                        self.layout,
                        self._plane,
                        self._ledger,
                        self._connect_timeout_s,
                        self._lease_s,
                        self._ssl_context,
                    )
                    self._connections[endpoint] = connection
                    self._num_opened += 1
            if connection is None or connection.submit(item):
                return connection is not None
        return False

    def _reap(self) -> None:
        for transfer_id, endpoint in self._ledger.reap():
            self._submit(endpoint, OutgoingAbort(transfer_id), reconnect=False)

    def _post_finished(self, transfer_id: str, state: TransferState) -> None:
        self._housekeeper.post(lambda: self.on_finished(transfer_id, state))
