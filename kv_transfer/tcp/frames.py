"""The tcp backend's wire format: every frame is a fixed header, the transfer id, block ids, then a payload.

    magic "PDKV" | version u8 | type u8 | flags u8 (bit 0: last chunk) | id length u8 | seq u32 |
    block count u32 | payload bytes u64 | transfer id (utf-8) | block ids (u32 each) | payload

All integers are big-endian. Frames by type (-> sender to receiver, <- receiver to sender):
    -> HELLO  payload: the sender's layout (JSON). <- HELLO payload: the receiver's layout; each side checks.
    -> CHUNK  seq, transfer id, destination block ids, flags; payload: the blocks' bytes, in block id order.
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

from kv_transfer.state import ProtocolError, TransferError, TransportError, error_from_code

MAGIC = b"PDKV"
VERSION = 1
FLAG_LAST = 1
MAX_BLOCKS_PER_FRAME = 1 << 20
MAX_JSON_NBYTES = 1 << 16
_HEADER = struct.Struct("!4sBBBBIIQ")
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

    def encode(self) -> bytes:
        transfer_id = self.transfer_id.encode()
        flags = FLAG_LAST if self.last else 0
        header = _HEADER.pack(
            MAGIC, VERSION, self.kind, flags, len(transfer_id), self.seq, len(self.block_ids), self.payload_nbytes
        )
        return header + transfer_id + struct.pack(f"!{len(self.block_ids)}I", *self.block_ids)


def encode_json_frame(kind: FrameType, body: dict[str, Any], seq: int = 0, transfer_id: str = "") -> bytes:
    payload = json.dumps(body).encode()
    return FrameHead(kind, seq, transfer_id, payload_nbytes=len(payload)).encode() + payload


def encode_error_frame(seq: int, transfer_id: str, error: TransferError) -> bytes:
    return encode_json_frame(FrameType.ERROR, {"code": error.code, "message": str(error)}, seq, transfer_id)


def read_head(sock: socket.socket, keep_waiting: KeepWaiting) -> FrameHead:
    header = recv_exact(sock, _HEADER.size, keep_waiting)
    magic, version, kind, flags, id_nbytes, seq, num_blocks, payload_nbytes = _HEADER.unpack(header)
    if magic != MAGIC or version != VERSION:
        raise ProtocolError(f"not a pdserve KV frame (magic {magic!r}, version {version})")
    if kind not in _FRAME_TYPES:
        raise ProtocolError(f"unknown frame type {kind}")
    if num_blocks > MAX_BLOCKS_PER_FRAME:
        raise ProtocolError(f"{num_blocks} blocks in one frame (at most {MAX_BLOCKS_PER_FRAME})")
    try:
        transfer_id = recv_exact(sock, id_nbytes, keep_waiting).decode()
    except UnicodeDecodeError as error:
        raise ProtocolError(f"transfer id is not utf-8: {error}") from None
    block_ids = struct.unpack(f"!{num_blocks}I", recv_exact(sock, 4 * num_blocks, keep_waiting))
    return FrameHead(FrameType(kind), seq, transfer_id, block_ids, bool(flags & FLAG_LAST), payload_nbytes)


def read_json(sock: socket.socket, head: FrameHead, keep_waiting: KeepWaiting) -> dict[str, Any]:
    if head.payload_nbytes > MAX_JSON_NBYTES:
        raise ProtocolError(f"{head.kind.name} payload of {head.payload_nbytes} bytes")
    body = json.loads(recv_exact(sock, head.payload_nbytes, keep_waiting))
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
