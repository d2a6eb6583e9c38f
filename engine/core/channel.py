"""The framing between a pod and its engine core process: length-prefixed pickles over a Unix socket pair.

Both ends are this project's own processes (the pod starts its core and hands it one end of a socket pair), so
pickle is safe here and costs far less than any schema'd encoding for the core's per-step outputs. A frame is a
4-byte big-endian length, then the pickled value. The core's side reads with blocking calls (`read_message`); the
pod's event loop feeds what its socket received to a `FrameDecoder`.
"""

from __future__ import annotations

import pickle
import socket
import struct

_HEADER = struct.Struct("!I")
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
"""Send and receive buffers of both ends: a burst of outputs never waits on the peer's reading."""


def encode(message: object) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """A connected pair of Unix stream sockets with large buffers: (the pod's end, the core's end)."""
    ends = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    for end in ends:
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
        end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
    return ends


class FrameDecoder:
    """Bytes in, in any pieces; whole messages out, in order."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[object]:
        buffer = self._buffer
        buffer += data
        messages: list[object] = []
        start = 0
        # NOTE: the view is released before the buffer is trimmed (a bytearray with live views cannot resize).
        with memoryview(buffer) as view:
            while len(buffer) - start >= _HEADER.size:
                (length,) = _HEADER.unpack_from(buffer, start)
                end = start + _HEADER.size + length
                if len(buffer) < end:
                    break
                messages.append(pickle.loads(view[start + _HEADER.size : end]))
                start = end
        del buffer[:start]
        return messages


def read_message(sock: socket.socket) -> object | None:
    """The next message from a blocking socket; None once the peer closed its end."""
    header = _read_exactly(sock, _HEADER.size)
    if header is None:
        return None
    (length,) = _HEADER.unpack(header)
    payload = _read_exactly(sock, length)
    if payload is None:
        return None
    return pickle.loads(payload)


def _read_exactly(sock: socket.socket, num_bytes: int) -> bytes | None:
    chunks: list[bytes] = []
    while num_bytes:
        chunk = sock.recv(min(num_bytes, SOCKET_BUFFER_BYTES))
        if not chunk:
            return None
        chunks.append(chunk)
        num_bytes -= len(chunk)
    return b"".join(chunks)
