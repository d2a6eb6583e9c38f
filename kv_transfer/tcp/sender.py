"""The tcp backend's sender: its data plane sends each chunk's bytes right after the CHUNK frame, on the socket."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Sequence
from typing import Any

import torch

from kv_transfer.control.data_plane import SenderLink, SenderPlane
from kv_transfer.control.frames import FrameHead
from kv_transfer.control.socket_sender import SocketSender
from kv_transfer.pool_io import HostBlocks, pool_bytes, start_gather_to_host


class _PayloadLink(SenderLink[HostBlocks]):
    def write(self, sock: socket.socket, head: FrameHead, staged: HostBlocks) -> None:
        payload = staged.wait().reshape(-1)
        sock.sendall(dataclasses.replace(head, payload_nbytes=payload.nbytes).encode())
        sock.sendall(payload.data)


class TcpSenderPlane(SenderPlane[HostBlocks]):
    """`stage` starts copying the blocks to host memory (from a GPU pool: without waiting for it); the link waits for
    the copy before it sends the bytes."""

    backend = "tcp"

    def __init__(self, rows: torch.Tensor) -> None:
        self._rows = rows

    def stage(self, src_block_ids: Sequence[int]) -> HostBlocks:
        return start_gather_to_host(self._rows, src_block_ids)

    def link(self, host: str, answer: dict[str, Any]) -> SenderLink[HostBlocks]:
        return _PayloadLink()


class TcpSender(SocketSender[HostBlocks]):
    """Ships blocks of `pool` over TCP: `send` starts copying them to host memory; the bytes follow their CHUNK
    frame."""

    def _make_plane(self, pool: torch.Tensor) -> SenderPlane[HostBlocks]:
        return TcpSenderPlane(pool_bytes(pool))
