"""The nccl backend's receiver: its data plane receives each chunk piece by piece (one NCCL receive each, as the
sender's HELLO sizes them) and scatters each piece into the reserved blocks as soon as it is in."""

from __future__ import annotations

import socket
import threading
import uuid
from datetime import timedelta
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from kv_transfer.control.data_plane import ReceiverLink, ReceiverPlane
from kv_transfer.control.frames import FrameHead, KeepWaiting
from kv_transfer.control.socket_receiver import SocketReceiver
from kv_transfer.copy_stream import Fence, make_copy_stream
from kv_transfer.nccl.gpu_identity import check_distinct_gpus, device_uuid
from kv_transfer.nccl.pair_group import RECEIVER_RANK, GroupFactory, NcclPairGroup, PairGroup, Receiving
from kv_transfer.nccl.pieces import piece_bounds
from kv_transfer.pool_io import block_index, pool_words
from kv_transfer.state import ProtocolError

# NOTE: how long a rank waits in the store for its peer's part of the rendezvous (NCCL's unique id).
_STORE_TIMEOUT = timedelta(seconds=30)


class _RecvLink(ReceiverLink):
    """Rank 1 of the connection's pair; the communicator comes with the first chunk that has blocks."""

    def __init__(
        self,
        words: torch.Tensor,
        store: dist.Store,
        answer: dict[str, Any],
        make_group: GroupFactory,
        blocks_per_piece: int,
    ) -> None:
        self._words = words
        self._stream = make_copy_stream(words.device)
        self._store = store
        self._answer = answer
        self._make_group = make_group
        self._blocks_per_piece = blocks_per_piece
        self._group: PairGroup | None = None

    @property
    def answer(self) -> dict[str, Any]:
        return self._answer

    def check(self, head: FrameHead) -> None:
        if head.payload_nbytes or head.src_block_ids:
            raise ProtocolError("an nccl chunk carries no payload and no source block ids: its bytes follow on NCCL")

    def land(self, sock: socket.socket, head: FrameHead, keep_waiting: KeepWaiting, fence: Fence) -> None:
        """NOTE: a piece is scattered only once it is all in, and the copy stream is drained before this returns or
        raises: a receive abandoned on a dead sender leaves nothing queued that could write into the blocks once
        their reservation ends (the staging buffer, NCCL's to write, is held by NCCL until its receive ends)."""
        if not head.block_ids:
            return
        blocks, pieces = self._receive(len(head.block_ids))
        self._stream.wait_for(fence)
        try:
            with self._stream.activate():
                ids = block_index(head.block_ids, self._words.device)
            for (start, stop), receiving in pieces:
                receiving.wait(keep_waiting)
                with self._stream.activate():
                    self._words.index_copy_(0, ids[start:stop], blocks[start:stop])
        finally:
            self._stream.synchronize()

    def drop(self, sock: socket.socket, head: FrameHead, keep_waiting: KeepWaiting) -> None:
        if head.block_ids:
            for _, receiving in self._receive(len(head.block_ids))[1]:
                receiving.wait(keep_waiting)

    def close(self) -> None:
        if self._group is not None:
            self._group.close()

    def _receive(self, num_blocks: int) -> tuple[torch.Tensor, list[tuple[tuple[int, int], Receiving]]]:
        """A staging buffer for the sender's next `num_blocks` blocks, and the receive of each piece into it, all
        queued at once."""
        with self._stream.activate():
            blocks = torch.empty((num_blocks, self._words.shape[1]), dtype=self._words.dtype, device=self._words.device)
            if self._group is None:
                self._group = self._make_group(self._store, RECEIVER_RANK)
            group = self._group
            bounds = piece_bounds(num_blocks, self._blocks_per_piece)
            return blocks, [((start, stop), group.recv(blocks[start:stop].view(-1))) for start, stop in bounds]


class NcclReceiverPlane(ReceiverPlane):
    """Refuses senders on its own GPU; starts its rendezvous store (on `host`, a free port) at the first nccl contact
    and gives each connection its own key prefix in it."""

    backend = "nccl"

    def __init__(self, pool: torch.Tensor, host: str, make_group: GroupFactory) -> None:
        self._words = pool_words(pool)
        self._device_uuid = device_uuid(pool.device)
        self._host = host
        self._make_group = make_group
        self._lock = threading.Lock()
        self._store: dist.TCPStore | None = None

    def accept(self, hello: dict[str, Any]) -> ReceiverLink:
        check_distinct_gpus(hello.get("device"), self._device_uuid)
        blocks_per_piece = hello.get("piece_blocks")
        if not isinstance(blocks_per_piece, int) or isinstance(blocks_per_piece, bool) or blocks_per_piece < 1:
            raise ProtocolError(f"an nccl HELLO names the blocks per piece of its chunks, got {blocks_per_piece!r}")
        prefix = f"kv-pair-{uuid.uuid4().hex}"
        with self._lock:
            if self._store is None:
                self._store = dist.TCPStore(
                    self._host, 0, is_master=True, wait_for_workers=False, timeout=_STORE_TIMEOUT
                )
            store = self._store
        answer = {"store_port": store.port, "prefix": prefix}
        return _RecvLink(self._words, dist.PrefixStore(prefix, store), answer, self._make_group, blocks_per_piece)

    def close(self) -> None:
        with self._lock:
            self._store = None


class NcclReceiver(SocketReceiver):
    """Receives chunks over NCCL into a GPU `pool`, one communicator per sender (see the package); its rendezvous
    store listens on the receiver's host. `pair_group` makes the pairs' communicators."""

    pair_group: ClassVar[GroupFactory] = NcclPairGroup

    def _make_plane(self, pool: torch.Tensor, host: str) -> ReceiverPlane:
        return NcclReceiverPlane(pool, host, type(self).pair_group)
