"""One sender's connection to a TcpReceiver, served on its own thread."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

from common.errors import InvalidArgumentError
from kv_transfer.layout import KVLayout
from kv_transfer.pool_io import BlockSink
from kv_transfer.reservation_table import ReservationTable
from kv_transfer.state import LayoutMismatchError, ProtocolError, TransferError
from kv_transfer.tcp.frames import (
    FrameHead,
    FrameType,
    discard,
    encode_error_frame,
    encode_json_frame,
    read_head,
    read_json,
    recv_blocks,
)

logger = logging.getLogger(__name__)


class ReceiverConnection:
    """The handshake, then chunks read straight into their reserved blocks, each answered by ACK or ERROR.

    NOTE: the socket has a short timeout, so a read waiting on a stalled sender re-checks, on each tick, that the
    receiver is still open and the chunk's reservation still writable; otherwise it gives up and drops the
    connection, so an expiry or abort releases the blocks within that tick even mid-chunk.
    """

    def __init__(
        self,
        sock: socket.socket,
        layout: KVLayout,
        table: ReservationTable,
        sink: BlockSink,
        is_closing: Callable[[], bool],
    ) -> None:
        self._sock = sock
        self._layout = layout
        self._table = table
        self._sink = sink
        self._is_closing = is_closing

    def run(self) -> None:
        try:
            if self._handshake():
                while True:
                    self._serve(read_head(self._sock, self._keep_open))
        except (TransferError, OSError) as error:
            logger.debug("kv receiver connection ends: %s", error)
        finally:
            self._sock.close()

    def _keep_open(self) -> bool:
        return not self._is_closing()

    def _keeps_writing(self, transfer_id: str) -> bool:
        return self._keep_open() and self._table.is_writable(transfer_id)

    def _handshake(self) -> bool:
        head = read_head(self._sock, self._keep_open)
        if head.kind is not FrameType.HELLO:
            raise ProtocolError(f"expected HELLO first, got {head.kind.name}")
        try:
            remote = KVLayout.from_dict(read_json(self._sock, head, self._keep_open)["layout"])
        except (InvalidArgumentError, KeyError, TypeError) as error:
            raise ProtocolError(f"bad HELLO layout: {error}") from None
        self._sock.sendall(encode_json_frame(FrameType.HELLO, {"layout": self._layout.to_dict()}))
        try:
            self._layout.check_compatible(remote)
        except LayoutMismatchError as error:
            logger.warning("kv receiver refuses a sender: %s", error)
            return False
        return True

    def _serve(self, head: FrameHead) -> None:
        if head.kind is FrameType.CHUNK:
            self._on_chunk(head)
        elif head.kind is FrameType.ABORT:
            discard(self._sock, head.payload_nbytes, self._keep_open)
            self._table.abort(head.transfer_id)
        else:
            raise ProtocolError(f"unexpected {head.kind.name} frame from a sender")

    def _on_chunk(self, head: FrameHead) -> None:
        if head.payload_nbytes != len(head.block_ids) * self._layout.block_nbytes:
            raise ProtocolError(f"chunk payload of {head.payload_nbytes} bytes for {len(head.block_ids)} blocks")
        try:
            self._table.begin_chunk(head.transfer_id, head.block_ids)
        except TransferError as error:
            discard(self._sock, head.payload_nbytes, self._keep_open)
            self._sock.sendall(encode_error_frame(head.seq, head.transfer_id, error))
            return
        complete = False
        try:
            write = self._sink.open(head.block_ids)
            recv_blocks(self._sock, write.buffers, lambda: self._keeps_writing(head.transfer_id))
            write.commit()
            complete = True
        finally:
            rejection = self._table.end_chunk(head.transfer_id, head.block_ids, head.last, complete)
        if rejection is None:
            self._sock.sendall(FrameHead(FrameType.ACK, head.seq, head.transfer_id).encode())
        else:
            self._sock.sendall(encode_error_frame(head.seq, head.transfer_id, rejection))
