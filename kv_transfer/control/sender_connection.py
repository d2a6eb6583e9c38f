"""One persistent connection from a SocketSender to one receiver endpoint, reused by every transfer to it."""

from __future__ import annotations

import contextlib
import logging
import queue
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Generic

from common.tls import INTERNAL_SERVER_NAME
from kv_transfer.bookkeeping.send_ledger import SendLedger
from kv_transfer.control.address import parse_endpoint
from kv_transfer.control.data_plane import SenderLink, SenderPlane, Staged
from kv_transfer.control.frames import FrameHead, FrameType, Hello, read_error, read_head, read_hello
from kv_transfer.control.tls_socket import TLSSocket
from kv_transfer.layout import KVLayout, check_transfer_layouts
from kv_transfer.state import ProtocolError, TransferError, TransportError

logger = logging.getLogger(__name__)

_SEQ_MODULUS = 1 << 32


@dataclass(frozen=True, slots=True)
class OutgoingChunk(Generic[Staged]):
    transfer_id: str
    dst_block_ids: tuple[int, ...]
    staged: Staged
    last: bool


@dataclass(frozen=True, slots=True)
class OutgoingAbort:
    transfer_id: str


Outgoing = OutgoingChunk[Staged] | OutgoingAbort


def _as_transfer_error(error: Exception) -> TransferError:
    return error if isinstance(error, TransferError) else TransportError(f"{type(error).__name__}: {error}")


class SenderConnection(Generic[Staged]):
    """A writer thread (connect, handshake, then frames out in submission order, each chunk's bytes moved by the
    data plane's link) and a reader thread (ACK and ERROR frames in, matched to chunks by seq). When the connection
    dies, every chunk queued or unacked on it fails its transfer; the sender opens a new connection for later chunks.
    """

    def __init__(
        self,
        endpoint: str,
        layout: KVLayout,
        plane: SenderPlane[Staged],
        ledger: SendLedger,
        connect_timeout_s: float,
        io_timeout_s: float,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._ssl_context = ssl_context
        self._layout = layout
        self._plane = plane
        self._ledger = ledger
        self._connect_timeout_s = connect_timeout_s
        self._io_timeout_s = io_timeout_s
        self._queue: queue.SimpleQueue[Outgoing[Staged] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._in_flight: dict[int, OutgoingChunk[Staged]] = {}
        self._next_seq = 0
        self._closed = False
        self._ready = False
        self._sock: socket.socket | None = None
        self._writer = threading.Thread(target=self._write_loop, name=f"kv-send-{endpoint}", daemon=True)
        self._writer.start()

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed

    def submit(self, item: Outgoing[Staged]) -> bool:
        """Queue a frame; False if the connection already died (nothing was queued)."""
        with self._lock:
            if not self._closed:
                self._queue.put(item)
            return not self._closed

    def close(self, timeout_s: float = 1.0) -> None:
        """Send what is queued (if the handshake is done), then drop the connection."""
        with self._lock:
            graceful = self._ready and not self._closed
            if graceful:
                self._queue.put(None)
        if graceful:
            self._writer.join(timeout_s)
        self._fail(TransportError(f"connection to {self.endpoint} closed by the sender"))
        self._writer.join(timeout_s)

    def _write_loop(self) -> None:
        reader: threading.Thread | None = None
        link: SenderLink[Staged] | None = None
        error: TransferError = TransportError(f"connection to {self.endpoint} closed")
        try:
            sock, link = self._connect()
            reader = threading.Thread(target=self._read_loop, args=(sock,), name="kv-send-acks", daemon=True)
            reader.start()
            while (item := self._queue.get()) is not None:
                self._write(sock, link, item)
        except Exception as caught:
            error = _as_transfer_error(caught)
        finally:
            self._fail(error)
            if reader is not None:
                reader.join(self._connect_timeout_s)
            if link is not None:
                link.close()
            if self._sock is not None:
                self._sock.close()

    def _connect(self) -> tuple[socket.socket, SenderLink[Staged]]:
        """Open the socket (with TLS: and shake hands, within the connect timeout), check the receiver's backend and
        layout against ours (both sides check), open the link."""
        host, port = parse_endpoint(self.endpoint)
        sock = socket.create_connection((host, port), timeout=self._connect_timeout_s)
        if self._ssl_context is not None:
            sock = TLSSocket(sock, self._ssl_context, server_side=False, server_hostname=INTERNAL_SERVER_NAME)
        with self._lock:
            self._sock = sock
            if self._closed:
                raise TransportError(f"connection to {self.endpoint} closed while connecting")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(Hello(self._plane.backend, self._layout, self._plane.hello()).encode())
        head = read_head(sock, lambda: False)
        if head.kind is FrameType.ERROR:
            raise read_error(sock, head, lambda: False)
        if head.kind is not FrameType.HELLO:
            raise ProtocolError(f"expected HELLO from {self.endpoint}, got {head.kind.name}")
        answer = read_hello(sock, head, lambda: False)
        check_transfer_layouts(self._layout, answer.layout)
        link = self._plane.link(host, answer.plane)
        sock.settimeout(self._io_timeout_s)
        with self._lock:
            self._ready = True
        return sock, link

    def _write(self, sock: socket.socket, link: SenderLink[Staged], item: Outgoing[Staged]) -> None:
        if isinstance(item, OutgoingAbort):
            sock.sendall(FrameHead(FrameType.ABORT, transfer_id=item.transfer_id).encode())
            return
        if not self._ledger.is_live(item.transfer_id):
            return
        with self._lock:
            closed = self._closed
            seq = self._next_seq
            if not closed:
                self._next_seq = (seq + 1) % _SEQ_MODULUS
                self._in_flight[seq] = item
        if closed:
            error = TransportError(f"connection to {self.endpoint} closed")
            self._ledger.fail(item.transfer_id, error)
            raise error
        link.write(sock, FrameHead(FrameType.CHUNK, seq, item.transfer_id, item.dst_block_ids, item.last), item.staged)

    def _read_loop(self, sock: socket.socket) -> None:
        try:
            while True:
                head = read_head(sock, lambda: not self.closed)
                if head.kind is FrameType.ACK:
                    self._on_answer(head.seq, None)
                elif head.kind is FrameType.ERROR:
                    self._on_answer(head.seq, read_error(sock, head, lambda: not self.closed))
                else:
                    raise ProtocolError(f"unexpected {head.kind.name} frame from {self.endpoint}")
        except Exception as error:
            self._fail(_as_transfer_error(error))

    def _on_answer(self, seq: int, error: TransferError | None) -> None:
        with self._lock:
            chunk = self._in_flight.pop(seq, None)
        if chunk is None:
            raise ProtocolError(f"answer for unknown chunk seq {seq} from {self.endpoint}")
        if error is None:
            num_blocks = len(chunk.dst_block_ids)
            self._ledger.ack(chunk.transfer_id, num_blocks * self._layout.block_nbytes, num_blocks, chunk.last)
        else:
            self._ledger.fail(chunk.transfer_id, error)

    def _fail(self, error: TransferError) -> None:
        """Mark the connection dead (once): wake both threads and fail every chunk queued or unacked on it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending: list[OutgoingChunk[Staged]] = list(self._in_flight.values())
            self._in_flight.clear()
            with contextlib.suppress(queue.Empty):
                while True:
                    item = self._queue.get_nowait()
                    if isinstance(item, OutgoingChunk):
                        pending.append(item)
            self._queue.put(None)
            sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if pending:
            logger.warning("kv connection to %s failed %d chunks: %s", self.endpoint, len(pending), error)
        for chunk in pending:
            self._ledger.fail(chunk.transfer_id, error)
