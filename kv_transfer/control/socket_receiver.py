"""The receiver of every socket backend: listens on host:port for control connections, one thread per sender; the
backend's data plane (`kv_transfer.control.data_plane`) lands each chunk's bytes.

With an `ssl_context` (mutual TLS: `common.tls.kv_server_context`), each connection's thread first runs the TLS
handshake, which requires the sender's certificate signed by the cluster CA. A peer without one is refused there:
the connection is logged and closed before any frame of it is read, so nothing it sent is applied. The tcp
backend's bytes travel on that same authenticated connection.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
from abc import abstractmethod
from collections.abc import Sequence

import torch

from kv_transfer.base import TransferHook, ignore_hook
from kv_transfer.bookkeeping.housekeeper import Housekeeper
from kv_transfer.bookkeeping.reservation_table import ReservationReceiver, ReservationTable
from kv_transfer.control.address import format_endpoint
from kv_transfer.control.data_plane import ReceiverPlane
from kv_transfer.control.receiver_connection import ReceiverConnection
from kv_transfer.control.tls_socket import TLSSocket
from kv_transfer.copy_stream import mark_stream
from kv_transfer.layout import KVLayout, KVRank

logger = logging.getLogger(__name__)

_WILDCARD_HOSTS = ("", "0.0.0.0", "::")
_HANDSHAKE_TIMEOUT_S = 5.0


class SocketReceiver(ReservationReceiver):
    """Receives chunks into `pool` through the data plane that a backend's subclass makes (`_make_plane`). Port 0
    picks a free port; `endpoint` reports the real one, with `advertise_host` (or, for a wildcard bind, this
    machine's hostname) as its host. `ssl_context`: mutual TLS on every connection (see the module docstring)."""

    def __init__(
        self,
        pool: torch.Tensor,
        block_size: int,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise_host: str | None = None,
        on_released: TransferHook = ignore_hook,
        reap_interval_s: float = 0.05,
        poll_interval_s: float = 0.1,
        ssl_context: ssl.SSLContext | None = None,
        rank: KVRank | None = None,
    ) -> None:
        self.layout = KVLayout.from_pool(pool, block_size, rank=rank)
        self.on_released = on_released
        self.num_connections_accepted = 0
        self.num_peers_refused = 0
        """Connections closed at the TLS handshake (no certificate of the cluster CA)."""
        self._ssl_context = ssl_context
        self._plane = self._make_plane(pool, host)
        self._device = pool.device
        self._table = ReservationTable(pool.shape[0], self._post_released)
        self._poll_interval_s = poll_interval_s
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._listener = socket.create_server((host, port), family=_family(host))
        self._listener.settimeout(poll_interval_s)
        bound_port = self._listener.getsockname()[1]
        if advertise_host is None:
            advertise_host = socket.gethostname() if host in _WILDCARD_HOSTS else host
        self._endpoint = format_endpoint(advertise_host, bound_port)
        self._housekeeper = Housekeeper(f"kv-receiver-{bound_port}", self._table.reap, reap_interval_s)
        self._acceptor = threading.Thread(target=self._accept_loop, name=f"kv-accept-{bound_port}", daemon=True)
        self._acceptor.start()

    @abstractmethod
    def _make_plane(self, pool: torch.Tensor, host: str) -> ReceiverPlane:
        """The backend's data plane into `pool`, for a receiver bound to `host` (called once, by the constructor)."""

    @property
    def endpoint(self) -> str:
        return self._endpoint

    def expect(self, transfer_id: str, dst_block_ids: Sequence[int], lease_s: float) -> None:
        """The reservation, fenced after the work queued so far on the calling thread's stream: the engine reserves
        from its own thread, so the chunks wait for the steps that may still touch freed blocks, and no later ones."""
        self._table.expect(transfer_id, dst_block_ids, lease_s, mark_stream(self._device))

    def close(self) -> None:
        self._closing.set()
        if threading.current_thread() is not self._acceptor:
            self._acceptor.join(5.0)
        self._listener.close()
        with self._lock:
            connections = list(self._connections.items())
        for sock, thread in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            thread.join(5.0)
        self._table.abort_all()
        self._housekeeper.stop()
        self._plane.close()

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError as error:
                if not self._closing.is_set():
                    logger.error("kv receiver %s stops accepting: %s", self._endpoint, error)
                return
            sock.settimeout(self._poll_interval_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            thread = threading.Thread(target=self._serve, args=(sock,), name="kv-receiver-conn", daemon=True)
            with self._lock:
                self.num_connections_accepted += 1
                self._connections[sock] = thread
            thread.start()

    def _serve(self, sock: socket.socket) -> None:
        try:
            peer = sock if self._ssl_context is None else self._authenticate(sock, self._ssl_context)
            if peer is not None:
                ReceiverConnection(peer, self.layout, self._table, self._plane, self._closing.is_set).run()
        finally:
            with self._lock:
                self._connections.pop(sock, None)

    def _authenticate(self, sock: socket.socket, context: ssl.SSLContext) -> TLSSocket | None:
        """The TLS handshake; None (logged, the socket closed) when the peer has no certificate of the cluster CA."""
        address = "?"
        try:
            address = sock.getpeername()
            sock.settimeout(_HANDSHAKE_TIMEOUT_S)
            peer = TLSSocket(sock, context, server_side=True)
        except (ssl.SSLError, OSError) as error:
            logger.warning(
                "kv receiver %s refused a peer at %s without the cluster's credentials: %s",
                self._endpoint,
                address,
                error,
            )
            with self._lock:
                self.num_peers_refused += 1
            sock.close()
            return None
        peer.settimeout(self._poll_interval_s)
        return peer


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
