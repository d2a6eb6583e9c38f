"""The cuda_ipc backend's sender: its data plane names the source blocks in the CHUNK frame, and the receiver copies
them out of this pool itself."""

from __future__ import annotations

import dataclasses
import socket
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from kv_transfer.control.data_plane import SenderLink, SenderPlane
from kv_transfer.control.frames import FrameHead
from kv_transfer.control.socket_sender import SocketSender
from kv_transfer.copy_stream import MarkedBlocks, make_copy_stream
from kv_transfer.cuda_ipc import local_pools
from kv_transfer.cuda_ipc.pool_handle import PoolHandle
from kv_transfer.pool_io import pool_bytes


class _NamingLink(SenderLink[MarkedBlocks]):
    def write(self, sock: socket.socket, head: FrameHead, staged: MarkedBlocks) -> None:
        staged.fence.synchronize()  # the engine's writes of these blocks are done: the receiver may read them now
        sock.sendall(dataclasses.replace(head, src_block_ids=staged.src_block_ids).encode())


class CudaIpcSenderPlane(SenderPlane[MarkedBlocks]):
    """Exports `pool` once (its HELLO fields: this process, the pool's key and IPC handle); `stage` only records an
    event after the caller's queued work, so `send` neither copies nor waits."""

    backend = "cuda_ipc"

    def __init__(self, pool: torch.Tensor, exported: Mapping[str, Any] | None = None) -> None:
        """`exported`: the pool's handle as the process that allocated it exported it (a parallel engine's worker):
        a pool mapped from another process cannot be exported again."""
        rows = pool_bytes(pool)
        self._stream = make_copy_stream(pool.device)
        self._key = uuid.uuid4().hex
        if exported is not None:
            self._handle: dict[str, Any] | None = PoolHandle.from_dict(dict(exported)).to_dict()
        else:
            self._handle = PoolHandle.export(rows).to_dict() if rows.is_cuda else None
        local_pools.register(self._key, rows)

    def hello(self) -> dict[str, Any]:
        return {"process": local_pools.process_id(), "pool": self._key, "handle": self._handle}

    def stage(self, src_block_ids: Sequence[int]) -> MarkedBlocks:
        return MarkedBlocks(tuple(src_block_ids), self._stream.mark())

    def link(self, host: str, answer: dict[str, Any]) -> SenderLink[MarkedBlocks]:
        return _NamingLink()

    def close(self) -> None:
        local_pools.unregister(self._key)


class CudaIpcSender(SocketSender[MarkedBlocks]):
    """Ships blocks of a GPU `pool` to receivers on this host, which read them straight out of it (see the package).
    `exported_handle`: see `CudaIpcSenderPlane`; the other arguments are SocketSender's."""

    def __init__(
        self, pool: torch.Tensor, block_size: int, *, exported_handle: Mapping[str, Any] | None = None, **options: Any
    ) -> None:
        self._exported_handle = exported_handle
        super().__init__(pool, block_size, **options)

    def _make_plane(self, pool: torch.Tensor) -> SenderPlane[MarkedBlocks]:
        return CudaIpcSenderPlane(pool, self._exported_handle)
