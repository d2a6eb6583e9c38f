"""The nccl backend's sender: its data plane gathers each chunk's blocks piece by piece into a small ring of staging
buffers, sending each piece in one NCCL send as soon as it is gathered (`kv_transfer.nccl.pieces`)."""

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
from kv_transfer.copy_stream import MarkedBlocks, make_copy_stream, mark_stream
from kv_transfer.nccl.gpu_identity import device_uuid
from kv_transfer.nccl.pair_group import SENDER_RANK, GroupFactory, NcclPairGroup, PairGroup, Sending
from kv_transfer.nccl.pieces import PIECE_NBYTES, piece_blocks, piece_bounds
from kv_transfer.pool_io import block_index, pool_words
from kv_transfer.state import ProtocolError, TransportError

# NOTE: pieces staged at once per connection: the gathers run up to this many pieces ahead of NCCL, and a sender
# whose receiver lags holds this much staging (4 x ~32 MB), however many chunks its writer has queued.
STAGED_PIECES = 4


class _SendLink(SenderLink[MarkedBlocks]):
    """Rank 0 of the connection's pair; the communicator comes with the first chunk that has blocks. Pieces are
    gathered into a ring of `STAGED_PIECES` staging buffers, each reused once its last send is done."""

    def __init__(self, words: torch.Tensor, store: dist.Store, make_group: GroupFactory, blocks_per_piece: int) -> None:
        self._words = words
        self._stream = make_copy_stream(words.device)
        self._store = store
        self._make_group = make_group
        self._blocks_per_piece = blocks_per_piece
        self._group: PairGroup | None = None
        self._ring: torch.Tensor | None = None
        self._ring_sends: list[Sending | None] = [None] * STAGED_PIECES
        self._next_slot = 0

    def write(self, sock: socket.socket, head: FrameHead, staged: MarkedBlocks) -> None:
        staged.fence.synchronize()  # the engine's writes of these blocks are done
        sock.sendall(head.encode())
        if not staged.src_block_ids:
            return
        with self._stream.activate():
            # NOTE: each send waits for its own piece's gather only (NCCL's stream waits for the copy stream as it
            # stands when the send is queued), and a gather into a slot waits for that slot's last send (the copy
            # stream waits for NCCL's; this thread does not): the gathers run ahead of the wire by the ring.
            ids = block_index(staged.src_block_ids, self._words.device)
            ring = self._staging_ring()
            for start, stop in piece_bounds(len(staged.src_block_ids), self._blocks_per_piece):
                slot = self._next_slot
                self._next_slot = (slot + 1) % STAGED_PIECES
                last_send = self._ring_sends[slot]
                if last_send is not None:
                    last_send.wait_sent()
                piece = ring[slot, : stop - start]
                torch.index_select(self._words, 0, ids[start:stop], out=piece)
                self._ring_sends[slot] = self._pair().send(piece.view(-1))

    def close(self) -> None:
        if self._group is not None:
            self._group.close()

    def _staging_ring(self) -> torch.Tensor:
        if self._ring is None:
            shape = (STAGED_PIECES, self._blocks_per_piece, self._words.shape[1])
            self._ring = torch.empty(shape, dtype=self._words.dtype, device=self._words.device)
        return self._ring

    def _pair(self) -> PairGroup:
        if self._group is None:
            self._group = self._make_group(self._store, SENDER_RANK)
        return self._group


class NcclSenderPlane(SenderPlane[MarkedBlocks]):
    """Names this pool's GPU and the blocks per piece of its chunks in the HELLO; `stage` only records an event after
    the caller's queued work, so `send` neither copies nor waits. `connect_timeout_s` bounds reaching the receiver's
    rendezvous store."""

    backend = "nccl"

    def __init__(
        self, pool: torch.Tensor, connect_timeout_s: float, make_group: GroupFactory, piece_nbytes: int
    ) -> None:
        self._words = pool_words(pool)
        self._blocks_per_piece = piece_blocks(piece_nbytes, self._words.shape[1] * self._words.element_size())
        self._connect_timeout = timedelta(seconds=connect_timeout_s)
        self._make_group = make_group

    def hello(self) -> dict[str, Any]:
        return {"device": device_uuid(self._words.device), "piece_blocks": self._blocks_per_piece}

    def stage(self, src_block_ids: Sequence[int]) -> MarkedBlocks:
        return MarkedBlocks(tuple(src_block_ids), mark_stream(self._words.device))

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
        return _SendLink(self._words, dist.PrefixStore(prefix, store), self._make_group, self._blocks_per_piece)


class NcclSender(SocketSender[MarkedBlocks]):
    """Ships blocks of a GPU `pool` over NCCL, one communicator per receiver (see the package). `pair_group` makes
    the pair's communicator; `piece_nbytes` bounds one NCCL send (the receiver follows the HELLO's piece size)."""

    pair_group: ClassVar[GroupFactory] = NcclPairGroup
    piece_nbytes: ClassVar[int] = PIECE_NBYTES

    def _make_plane(self, pool: torch.Tensor) -> SenderPlane[MarkedBlocks]:
        return NcclSenderPlane(pool, self._connect_timeout_s, type(self).pair_group, type(self).piece_nbytes)
