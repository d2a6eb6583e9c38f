"""The nccl backend's sender: its data plane gathers each chunk's blocks into one buffer and sends it in one NCCL
send."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from kv_transfer.control.data_plane import SenderLink, SenderPlane
from kv_transfer.control.frames import FrameHead
from kv_transfer.control.socket_sender import SocketSender
from kv_transfer.copy_stream import CopyStream, MarkedBlocks, make_copy_stream
from kv_transfer.nccl.gpu_identity import device_uuid
from kv_transfer.nccl.pair_group import SENDER_RANK, GroupFactory, NcclPairGroup, PairGroup
from kv_transfer.pool_io import block_index, pool_words
from kv_transfer.state import ProtocolError, TransportError


class _SendLink(SenderLink[MarkedBlocks]):
    """Rank 0 of the connection's pair; the communicator comes with the first chunk that has blocks."""

    def __init__(self, words: torch.Tensor, stream: CopyStream, store: dist.Store, make_group: GroupFactory) -> None:
        self._words = words
        self._stream = stream
        self._store = store
        self._make_group = make_group
        self._group: PairGroup | None = None

    def write(self, sock: socket.socket, head: FrameHead, staged: MarkedBlocks) -> None:
        staged.fence.synchronize()  # the engine's writes of these blocks are done
        sock.sendall(head.encode())
        if not staged.src_block_ids:
            return
        with self._stream.activate():
            blocks = self._words.index_select(0, block_index(staged.src_block_ids, self._words.device))
            self._pair().send(blocks.view(-1))

    def close(self) -> None:
        if self._group is not None:
            self._group.close()

    def _pair(self) -> PairGroup:
        if self._group is None:
            self._group = self._make_group(self._store, SENDER_RANK)
        return self._group


class NcclSenderPlane(SenderPlane[MarkedBlocks]):
    """Names this pool's GPU in the HELLO; `stage` only records an event after the caller's queued work, so `send`
    neither copies nor waits. `connect_timeout_s` bounds reaching the receiver's rendezvous store."""

    backend = "nccl"

    def __init__(self, pool: torch.Tensor, connect_timeout_s: float, make_group: GroupFactory) -> None:
        self._words = pool_words(pool)
        self._stream = make_copy_stream(pool.device)
        self._connect_timeout = timedelta(seconds=connect_timeout_s)
        self._make_group = make_group

    def hello(self) -> dict[str, Any]:
        return {"device": device_uuid(self._words.device)}

    def stage(self, src_block_ids: Sequence[int]) -> MarkedBlocks:
        return MarkedBlocks(tuple(src_block_ids), self._stream.mark())

    def link(self, host: str, answer: dict[str, Any]) -> SenderLink[MarkedBlocks]:
        port, prefix = answer.get("store_port"), answer.get("prefix")
        if not isinstance(port, int) or not isinstance(prefix, str):
            raise ProtocolError(f"an nccl HELLO answer names the pair's store port and prefix, got {answer!r:.200}")
        try:
            store = dist.TCPStore(host, port, is_master=False, timeout=self._connect_timeout)
        except RuntimeError as error:
            raise TransportError(
                f"cannot reach the receiver's NCCL rendezvous store at {host}:{port}: {error}"
            ) from None
        return _SendLink(self._words, self._stream, dist.PrefixStore(prefix, store), self._make_group)


class NcclSender(SocketSender[MarkedBlocks]):
    """Ships blocks of a GPU `pool` over NCCL, one communicator per receiver (see the package). `pair_group` makes
    the pair's communicator."""

    pair_group: ClassVar[GroupFactory] = NcclPairGroup

    def _make_plane(self, pool: torch.Tensor) -> SenderPlane[MarkedBlocks]:
        return NcclSenderPlane(pool, self._connect_timeout_s, type(self).pair_group)
