"""The cuda_ipc backend's receiver: its data plane maps each sender's pool once and copies the named blocks out of
it, GPU to GPU, in one pass (`kv_transfer.block_copy`)."""

from __future__ import annotations

import socket
import threading
import weakref
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

import torch

from kv_transfer.block_copy import compile_for, copy_blocks
from kv_transfer.control.data_plane import ReceiverLink, ReceiverPlane
from kv_transfer.control.frames import FrameHead, KeepWaiting
from kv_transfer.control.socket_receiver import SocketReceiver
from kv_transfer.copy_stream import CopyStream, Fence, make_copy_stream
from kv_transfer.cuda_ipc import local_pools
from kv_transfer.cuda_ipc.pool_handle import PoolHandle
from kv_transfer.pool_io import IndexUploader, pool_words, row_words
from kv_transfer.state import ProtocolError, TransportError


class _CopyLink(ReceiverLink):
    """Lands a chunk by copying its blocks out of the sender's pool (`source`) into this pool, on its own stream."""

    queues_copies = True

    def __init__(self, source: torch.Tensor, words: torch.Tensor) -> None:
        self._source = source
        self._words = words
        self._stream: CopyStream = make_copy_stream(words.device)

    def check(self, head: FrameHead) -> None:
        if head.payload_nbytes or len(head.src_block_ids) != len(head.block_ids):
            raise ProtocolError(
                f"a cuda_ipc chunk names one source block per destination block and carries no payload; got "
                f"{len(head.src_block_ids)} sources, {len(head.block_ids)} destinations, {head.payload_nbytes} bytes"
            )
        if max(head.src_block_ids, default=0) >= self._source.shape[0]:
            raise ProtocolError(f"source block ids {list(head.src_block_ids)} outside the sender's pool")

    def land(self, sock: socket.socket, head: FrameHead, keep_waiting: KeepWaiting, fence: Fence) -> None:
        self.start(sock, head, keep_waiting, fence).synchronize()

    def start(self, sock: socket.socket, head: FrameHead, keep_waiting: KeepWaiting, fence: Fence) -> Fence:
        """Queue the chunk's copy on the link's stream; the returned fence passes once it is done."""
        self._stream.wait_for(fence)
        with self._stream.activate():
            self._copy(head.src_block_ids, head.block_ids)
            return self._stream.mark()

    def drop(self, sock: socket.socket, head: FrameHead, keep_waiting: KeepWaiting) -> None:
        """Nothing to drain: the bytes never left the sender's pool."""

    @abstractmethod
    def _copy(self, src_block_ids: Sequence[int], dst_block_ids: Sequence[int]) -> None:
        """Queue the copy of the blocks on the current stream."""


class _KernelLink(_CopyLink):
    """A GPU pool and a source mapped on its device (the sender's pool on this GPU, or on another one over NVLink):
    one pass, `block_copy.copy_blocks`, each byte read from the source and written here once."""

    def __init__(self, source: torch.Tensor, words: torch.Tensor) -> None:
        super().__init__(source, words)
        self._ids = IndexUploader(words.device)

    def _copy(self, src_block_ids: Sequence[int], dst_block_ids: Sequence[int]) -> None:
        src, dst = self._ids.upload(src_block_ids, dst_block_ids)
        copy_blocks(self._source, src, self._words, dst)


class _GatherLink(_CopyLink):
    """A host pool, or a source on another device of this process (a colocated sender's pool, not mapped here): a
    gather on the source's device, then a scatter into this pool."""

    def __init__(self, source: torch.Tensor, words: torch.Tensor) -> None:
        super().__init__(source, words)
        self._source_ids = IndexUploader(source.device)
        self._ids = IndexUploader(words.device)

    def _copy(self, src_block_ids: Sequence[int], dst_block_ids: Sequence[int]) -> None:
        (src,) = self._source_ids.upload(src_block_ids)
        (dst,) = self._ids.upload(dst_block_ids)
        blocks = self._source.index_select(0, src)
        self._words.index_copy_(0, dst, blocks.to(self._words.device))


def _copy_link(source: torch.Tensor, words: torch.Tensor) -> _CopyLink:
    if words.is_cuda and source.device == words.device:
        return _KernelLink(source, words)
    return _GatherLink(source, words)


class CudaIpcReceiverPlane(ReceiverPlane):
    """Maps a sender's pool at its first connection and shares the mapping with its later ones; the mapping goes
    when the last of them closes."""

    backend = "cuda_ipc"

    def __init__(self, pool: torch.Tensor) -> None:
        self._words = pool_words(pool)
        if self._words.is_cuda:
            compile_for(self._words)
        self._lock = threading.Lock()
        # NOTE: the links hold the mapped pools (as words); a mapping lives as long as one of them does.
        self._mapped: weakref.WeakValueDictionary[str, torch.Tensor] = weakref.WeakValueDictionary()

    def accept(self, hello: dict[str, Any]) -> ReceiverLink:
        process, key, handle = hello.get("process"), hello.get("pool"), hello.get("handle")
        if not isinstance(process, str) or not isinstance(key, str):
            raise ProtocolError(f"a cuda_ipc HELLO names the sender's process and pool, got {sorted(hello)}")
        with self._lock:
            source = self._mapped.get(key)
            if source is None:
                rows = local_pools.lookup(key) if process == local_pools.process_id() else self._open(handle)
                source = self._mapped[key] = row_words(rows)
        return _copy_link(source, self._words)

    def _open(self, handle: Any) -> torch.Tensor:
        if handle is None:
            raise TransportError("the cuda_ipc sender's pool is not on a GPU: there is nothing to map")
        try:
            return PoolHandle.from_dict(handle).open(self._words.device)
        except RuntimeError as error:
            raise TransportError(f"cannot map the sender's pool over CUDA IPC: {error}") from None


class CudaIpcReceiver(SocketReceiver):
    """Receives chunks into a GPU `pool` by copying them out of the senders' pools (see the package)."""

    def _make_plane(self, pool: torch.Tensor, host: str) -> ReceiverPlane:
        return CudaIpcReceiverPlane(pool)
