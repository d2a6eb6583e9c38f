"""The wire format of the socket backends' connections: a fixed header, the transfer id, block ids, then a payload.

    magic "PDKV" | version u8 | type u8 | flags u8 (bit 0: last chunk) | id length u8 | seq u32 |
    block count u32 | source block count u32 | payload bytes u64 |
    transfer id (utf-8) | block ids (u32 each) | source block ids (u32 each) | payload

All integers are big-endian. Frames by type (-> sender to receiver, <- receiver to sender):
    -> HELLO  payload (JSON): {"backend", "layout", "plane": the backend's data-plane fields}.
    <- HELLO  the receiver's, same fields (each side checks the layouts), or <- ERROR when it refuses the sender.
    -> CHUNK  seq, transfer id, destination block ids, flags; where the bytes are depends on the backend:
              tcp: the payload, in block id order; cuda_ipc: in the sender's pool, at the source block ids (the
              receiver copies them out); nccl: no payload, the bytes follow on the pair's NCCL communicator.
    <- ACK    seq of the chunk written.            <- ERROR  seq; payload: {"code", "message"} (JSON).
    -> ABORT  transfer id; no answer.
"""

from __future__ import annotations

import enum
import json
import socket
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from common.errors import InvalidArgumentError
from kv_transfer.layout import KVLayout
from kv_transfer.state import ProtocolError, TransferError, TransportError, error_from_code

MAGIC = b"PDKV"
VERSION = 2
FLAG_LAST = 1
MAX_BLOCKS_PER_FRAME = 1 << 20
MAX_JSON_NBYTES = 1 << 16
_HEADER = struct.Struct("!4sBBBBIIIQ")
# NOTE: magic and version are checked before the rest of the header is read: a stray client is dropped at once.
_PREAMBLE = struct.Struct("!4sB")
_SCRATCH_NBYTES = 1 << 16

KeepWaiting = Callable[[], bool]


class FrameType(enum.IntEnum):
    HELLO = 1
    CHUNK = 2
    ACK = 3
    ERROR = 4
    ABORT = 5


_FRAME_TYPES = frozenset(int(kind) for kind in FrameType)


@dataclass(frozen=True, slots=True)
class FrameHead:
    """Everything of a frame but its payload (`payload_nbytes` bytes still to be read from the socket)."""

    kind: FrameType
    seq: int = 0
    transfer_id: str = ""
    block_ids: tuple[int, ...] = ()
    last: bool = False
    payload_nbytes: int = 0
    src_block_ids: tuple[int, ...] = ()

    def encode(self) -> bytes:
        transfer_id = self.transfer_id.encode()
        flags = FLAG_LAST if self.last else 0
        num_ids, num_src_ids = len(self.block_ids), len(self.src_block_ids)
        header = _HEADER.pack(
            MAGIC, VERSION, self.kind, flags, len(transfer_id), self.seq, num_ids, num_src_ids, self.payload_nbytes
        )
        return header + transfer_id + struct.pack(f"!{num_ids + num_src_ids}I", *self.block_ids, *self.src_block_ids)


@dataclass(frozen=True, slots=True)
class Hello:
    """The handshake both sides send: backend name, pool layout, and the backend's data-plane fields (`plane`)."""

    backend: str
    layout: KVLayout
    plane: dict[str, Any]

    def encode(self) -> bytes:
        return encode_json_frame(
            FrameType.HELLO, {"backend": self.backend, "layout": self.layout.to_dict(), "plane": self.plane}
        )


def encode_json_frame(kind: FrameType, body: dict[str, Any], seq: int = 0, transfer_id: str = "") -> bytes:
    payload = json.dumps(body).encode()
    return FrameHead(kind, seq, transfer_id, payload_nbytes=len(payload)).encode() + payload


def encode_error_frame(seq: int, transfer_id: str, error: TransferError) -> bytes:
    return encode_json_frame(FrameType.ERROR, {"code": error.code, "message": str(error)}, seq, transfer_id)


def read_head(sock: socket.socket, keep_waiting: KeepWaiting) -> FrameHead:
    preamble = recv_exact(sock, _PREAMBLE.size, keep_waiting)
    magic, version = _PREAMBLE.unpack(preamble)
    if magic != MAGIC or version != VERSION:
        raise ProtocolError(f"not a pdserve KV frame (magic {magic!r}, version {version})")
    header = preamble + recv_exact(sock, _HEADER.size - _PREAMBLE.size, keep_waiting)
    _, _, kind, flags, id_nbytes, seq, num_ids, num_src_ids, payload_nbytes = _HEADER.unpack(header)
    if kind not in _FRAME_TYPES:
        raise ProtocolError(f"unknown frame type {kind}")
    if max(num_ids, num_src_ids) > MAX_BLOCKS_PER_FRAME:
        raise ProtocolError(f"{max(num_ids, num_src_ids)} blocks in one frame (at most {MAX_BLOCKS_PER_FRAME})")
    try:
        transfer_id = recv_exact(sock, id_nbytes, keep_waiting).decode()
    except UnicodeDecodeError as error:
        raise ProtocolError(f"transfer id is not utf-8: {error}") from None
    ids = struct.unpack(f"!{num_ids + num_src_ids}I", recv_exact(sock, 4 * (num_ids + num_src_ids), keep_waiting))
    last = bool(flags & FLAG_LAST)
    return FrameHead(FrameType(kind), seq, transfer_id, ids[:num_ids], last, payload_nbytes, ids[num_ids:])


def read_hello(sock: socket.socket, head: FrameHead, keep_waiting: KeepWaiting) -> Hello:
    """The HELLO whose head was read; ProtocolError if its fields are missing or malformed."""
    body = read_json(sock, head, keep_waiting)
    backend, plane = body.get("backend"), body.get("plane")
    if not isinstance(backend, str) or not isinstance(plane, dict):
        raise ProtocolError(f"HELLO needs a backend name and plane fields, got {sorted(body)}")
    try:
        layout = KVLayout.from_dict(body["layout"])
    except (InvalidArgumentError, KeyError, TypeError) as error:
        raise ProtocolError(f"bad HELLO layout: {error}") from None
    return Hello(backend, layout, plane)


def read_json(sock: socket.socket, head: FrameHead, keep_waiting: KeepWaiting) -> dict[str, Any]:
    if head.payload_nbytes > MAX_JSON_NBYTES:
        raise ProtocolError(f"{head.kind.name} payload of {head.payload_nbytes} bytes")
    try:
        body = json.loads(recv_exact(sock, head.payload_nbytes, keep_waiting))
    except ValueError as error:
        raise ProtocolError(f"{head.kind.name} payload is not JSON: {error}") from None
    if not isinstance(body, dict):
        raise ProtocolError(f"{head.kind.name} payload is not a JSON object")
    return body


def read_error(sock: socket.socket, head: FrameHead, keep_waiting: KeepWaiting) -> TransferError:
    body = read_json(sock, head, keep_waiting)
    return error_from_code(str(body.get("code")), str(body.get("message")))


def recv_exact(sock: socket.socket, nbytes: int, keep_waiting: KeepWaiting) -> bytes:
    buffer = bytearray(nbytes)
    recv_into_exact(sock, memoryview(buffer), keep_waiting)
    return bytes(buffer)


def recv_into_exact(sock: socket.socket, view: memoryview, keep_waiting: KeepWaiting) -> None:
    """Fill `view` from the socket. A socket timeout asks `keep_waiting()`: False gives up (TransportError)."""
    offset = 0
    while offset < len(view):
        try:
            received = sock.recv_into(view[offset:])
        except TimeoutError:
            if keep_waiting():
                continue
            raise TransportError("gave up waiting for the peer") from None
        if received == 0:
            raise TransportError("connection closed by the peer")
        offset += received


def recv_blocks(sock: socket.socket, buffers: Sequence[memoryview], keep_waiting: KeepWaiting) -> None:
    for buffer in buffers:
        recv_into_exact(sock, buffer, keep_waiting)


def discard(sock: socket.socket, nbytes: int, keep_waiting: KeepWaiting) -> None:
    """Read and drop a payload that must not be written anywhere."""
    scratch = memoryview(bytearray(min(nbytes, _SCRATCH_NBYTES)))
    while nbytes > 0:
        chunk = scratch[: min(nbytes, len(scratch))]
        recv_into_exact(sock, chunk, keep_waiting)
        nbytes -= len(chunk)
