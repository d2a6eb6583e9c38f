"""`TLSSocket`: a TLS connection that one thread may write while another reads, as a sender's connection does
(its writer thread sends chunks while its reader thread takes ACKs).

NOTE: an `ssl.SSLSocket` may not be used so: OpenSSL's SSL object is not safe for concurrent SSL_read and SSL_write,
and under load such a connection stalls or fails (a 30 s write timeout was seen). Here the SSL object works on two
memory BIOs under one lock and never touches the socket; the socket I/O runs outside that lock, so a read waiting
for bytes never holds up a write. A second lock orders the ciphertext on the wire: whoever takes bytes out of the
outgoing BIO sends them before anyone takes more.
"""

from __future__ import annotations

import socket
import ssl
import threading
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

_RECV_NBYTES = 1 << 16
_WRITE_NBYTES = 1 << 20


class TLSSocket(socket.socket):
    """`sock` (connected; its timeout kept) wrapped in TLS: the handshake runs in the constructor, whose errors
    (`ssl.SSLError` for a peer without acceptable credentials, TimeoutError, OSError) propagate. `recv_into` and
    `sendall` carry plaintext; the socket's other methods (settimeout, shutdown, close) act on the connection."""

    def __init__(
        self, sock: socket.socket, context: ssl.SSLContext, server_side: bool, server_hostname: str | None = None
    ) -> None:
        timeout = sock.gettimeout()
        super().__init__(sock.family, sock.type, sock.proto, fileno=sock.detach())
        self.settimeout(timeout)
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side, server_hostname)
        self._lock = threading.Lock()
        """Guards the SSL object and its BIOs."""
        self._send_lock = threading.Lock()
        """Held from taking ciphertext out of the outgoing BIO until it is on the socket."""
        try:
            self._handshake()
        except BaseException:
            self.close()
            raise

    def recv_into(self, buffer: WriteableBuffer, nbytes: int = 0, flags: int = 0) -> int:
        """Up to `nbytes` (0: the buffer's size) bytes of plaintext into `buffer`; 0 once the peer closed."""
        view = memoryview(buffer).cast("B")
        size = nbytes or len(view)
        while True:
            with self._lock:
                try:
                    # NOTE: with a buffer, read returns the count (typeshed types only the bytes form).
                    received: int | None = cast(int, self._tls.read(size, view))
                except ssl.SSLWantReadError:
                    received = None
                except ssl.SSLZeroReturnError:
                    received = 0
            self._flush(wait=False)
            if received is not None:
                return received
            if not self._feed():
                return 0

    def sendall(self, data: ReadableBuffer, flags: int = 0) -> None:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), _WRITE_NBYTES):
            with self._send_lock:
                with self._lock:
                    self._tls.write(view[start : start + _WRITE_NBYTES])
                    ciphertext = self._outgoing.read()
                super().sendall(ciphertext)

    def _handshake(self) -> None:
        while True:
            with self._lock:
                try:
                    self._tls.do_handshake()
                    done = True
                except ssl.SSLWantReadError:
                    done = False
                except ssl.SSLError:
                    # NOTE: the alert that says why goes to the peer before the error propagates.
                    ciphertext = self._outgoing.read()
                    if ciphertext:
                        super().sendall(ciphertext)
                    raise
            self._flush(wait=True)
            if done:
                return
            if not self._feed():
                raise ConnectionResetError("connection closed during the TLS handshake")

    def _feed(self) -> bool:
        """One read of ciphertext from the socket into the SSL object; False at the end of the stream."""
        data = super().recv(_RECV_NBYTES)
        with self._lock:
            if data:
                self._incoming.write(data)
            else:
                self._incoming.write_eof()
        return bool(data)

    def _flush(self, wait: bool) -> None:
        """Send the ciphertext the SSL object produced; without `wait`, only if no write is under way (that write
        then sends it)."""
        if not self._outgoing.pending:
            return
        if not self._send_lock.acquire(blocking=wait):
            return
        try:
            with self._lock:
                ciphertext = self._outgoing.read()
            if ciphertext:
                super().sendall(ciphertext)
        finally:
            self._send_lock.release()
