"""The tcp backend's receiver: its data plane reads each chunk's bytes from the socket, after the CHUNK frame."""

from __future__ import annotations

import socket
from typing import Any

import torch

from kv_transfer.control.data_plane import ReceiverLink, ReceiverPlane
from kv_transfer.control.frames import FrameHead, KeepWaiting, discard, recv_blocks
from kv_transfer.control.socket_receiver import SocketReceiver
from kv_transfer.copy_stream import Fence
from kv_transfer.pool_io import BlockSink, make_block_sink, pool_bytes
from kv_transfer.state import ProtocolError


class _PayloadLink(ReceiverLink):
    def __init__(self, sink: BlockSink, block_nbytes: int) -> None:
        self._sink = sink
        self._block_nbytes = block_nbytes

    def check(self, head: FrameHead) -> None:
        if head.src_block_ids or head.payload_nbytes != len(head.block_ids) * self._block_nbytes:
            raise ProtocolError(f"chunk payload of {head.payload_nbytes} bytes for {len(head.block_ids)} blocks")

    def land(self, sock: socket.socket, head: FrameHead, keep_waiting: KeepWaiting, fence: Fence) -> None:
        write = self._sink.open(head.block_ids)
        recv_blocks(sock, write.buffers, keep_waiting)
        fence.synchronize()
        write.commit()

    def drop(self, sock: socket.socket, head: FrameHead, keep_waiting: KeepWaiting) -> None:
        discard(sock, head.payload_nbytes, keep_waiting)


class TcpReceiverPlane(ReceiverPlane):
    """Reads each chunk straight into its blocks (host pool) or through host staging (GPU pool)."""

    backend = "tcp"

    def __init__(self, rows: torch.Tensor) -> None:
        self._link = _PayloadLink(make_block_sink(rows), rows.shape[1])

    def accept(self, hello: dict[str, Any]) -> ReceiverLink:
        return self._link


class TcpReceiver(SocketReceiver):
    """Receives chunks over TCP into `pool`, reading each chunk's payload straight into its blocks."""

    def _make_plane(self, pool: torch.Tensor, host: str) -> ReceiverPlane:
        return TcpReceiverPlane(pool_bytes(pool))
