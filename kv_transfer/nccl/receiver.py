"""The nccl backend's receiver: its data plane receives each chunk in one NCCL receive and scatters it into the
reserved blocks."""

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
from kv_transfer.nccl.pair_group import RECEIVER_RANK, GroupFactory, NcclPairGroup, PairGroup
from kv_transfer.pool_io import block_index, pool_words
from kv_transfer.state import ProtocolError

# NOTE: how long a rank waits in the store for its peer's part of the rendezvous (NCCL's unique id).
_STORE_TIMEOUT = timedelta(seconds=30)


class _RecvLink(ReceiverLink):
    """Rank 1 of the connection's pair; the communicator comes with the first chunk that has blocks."""

    def __init__(self, words: torch.Tensor, store: dist.Store, answer: dict[str, Any], make_group: GroupFactory):
        self._words = words
        self._stream = make_copy_stream(words.device)
        self._store = store
        self._answer = answer
        self._make_group = make_group
        self._group: PairGroup | None = None

    @property
    def answer(self) -> dict[str, Any]:
        return self._answer

    def check(self, head: FrameHead) -> None:
        if head.payload_nbytes or head.src_block_ids:
            raise ProtocolError("an nccl chunk carries no payload and no source block ids: its bytes follow on NCCL")

    def land(self, sock: socket.socket, head: FrameHead, keep_waiting: KeepWaiting, fence: Fence) -> None:
        if not head.block_ids:
            return
        blocks = self._receive(len(head.block_ids), keep_waiting)
        self._stream.wait_for(fence)
        with self._stream.activate():
            self._words.index_copy_(0, block_index(head.block_ids, self._words.device), blocks)
        self._stream.synchronize()

    def drop(self, sock: socket.socket, head: FrameHead, keep_waiting: KeepWaiting) -> None:
        if head.block_ids:
            self._receive(len(head.block_ids), keep_waiting)

    def close(self) -> None:
        if self._group is not None:
            self._group.close()

    def _receive(self, num_blocks: int, keep_waiting: KeepWaiting) -> torch.Tensor:
        """The sender's next blocks, in a staging buffer. NOTE: nothing is queued on the copy stream before they are
        all in, so a receive abandoned on a dead sender can never write into blocks released meanwhile."""
        with self._stream.activate():
            blocks = torch.empty((num_blocks, self._words.shape[1]), dtype=self._words.dtype, device=self._words.device)
            if self._group is None:
                self._group = self._make_group(self._store, RECEIVER_RANK)
            self._group.recv(blocks.view(-1), keep_waiting)
        return blocks


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
        prefix = f"kv-pair-{uuid.uuid4().hex}"
        with self._lock:
            if self._store is None:
                self._store = dist.TCPStore(
                    self._host, 0, is_master=True, wait_for_workers=False, timeout=_STORE_TIMEOUT
                )
            store = self._store
        answer = {"store_port": store.port, "prefix": prefix}
        return _RecvLink(self._words, dist.PrefixStore(prefix, store), answer, self._make_group)

    def close(self) -> None:
        with self._lock:
            self._store = None


class NcclReceiver(SocketReceiver):
    """Receives chunks over NCCL into a GPU `pool`, one communicator per sender (see the package); its rendezvous
    store listens on the receiver's host. `pair_group` makes the pairs' communicators."""

    pair_group: ClassVar[GroupFactory] = NcclPairGroup

    def _make_plane(self, pool: torch.Tensor, host: str) -> ReceiverPlane:
        return NcclReceiverPlane(pool, host, type(self).pair_group)
