"""The KV transfer interface: a sender on the prefill side, a receiver on the decode side.

Lifecycle of one transfer (ids come from the decode pod's Reserve; the control plane is the services' job):
1. decode: `receiver.expect(transfer_id, dst_block_ids, lease_s)` -> RESERVED. The decode engine owns the blocks;
   the receiver only holds the right to write into them until the transfer ends.
2. prefill: `sender.send(transfer_id, endpoint, layout, src_block_ids, dst_block_ids, last)` per finished chunk.
   The first contact between a sender and a receiver compares their layouts: a mismatch fails the transfer
   with LayoutMismatchError before any byte moves. The receiver writes each chunk into its destination blocks
   and acks it (RESERVED -> TRANSFERRING); after the last chunk, with every reserved block written, -> DONE.
3. decode: `receiver.wait(...)` -> DONE, then `receiver.claim(transfer_id)`: the record is dropped and the
   blocks simply stay with the decode engine.
Ends without a claim: the reservation lease lapses (EXPIRED), either side aborts (ABORTED; a sender's abort
reaches the receiver even before the first chunk, given the endpoint), or a chunk is invalid (FAILED). The
receiver then calls `on_released(transfer_id, state)` once, so the decode engine frees the blocks, and rejects
every later chunk of that transfer without writing it: a read after expiry is an error, never data. The prefill
side keeps its source blocks pinned until `on_finished(transfer_id, state)`: DONE once the last chunk is acked,
FAILED/ABORTED, or EXPIRED when no ack came within its lease (every ack renews it).
Hooks run on the backend's own housekeeping thread, never inside a call into the backend: keep them short and
thread-safe (e.g. hand the id to the engine's queue).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from common.errors import InvalidArgumentError
from kv_transfer.layout import KVLayout
from kv_transfer.state import TransferError, TransferState

TransferHook = Callable[[str, TransferState], None]

# NOTE: the tcp frame header stores the id's length in one byte; every backend keeps to it.
MAX_TRANSFER_ID_BYTES = 255


def check_block_ids(block_ids: Sequence[int], num_blocks: int, field: str) -> None:
    if not all(0 <= block_id < num_blocks for block_id in block_ids):
        raise InvalidArgumentError(field, f"block ids must be in [0, {num_blocks}), got {list(block_ids)}")


def ignore_hook(transfer_id: str, state: TransferState) -> None:
    """The default hook: does nothing."""


def check_send_args(
    transfer_id: str, src_block_ids: Sequence[int], dst_block_ids: Sequence[int], num_blocks: int
) -> None:
    """The argument checks every `KVSender.send` makes before touching its pool of `num_blocks` blocks."""
    check_block_ids(src_block_ids, num_blocks, "src_block_ids")
    if not transfer_id or len(transfer_id.encode()) > MAX_TRANSFER_ID_BYTES:
        raise InvalidArgumentError("transfer_id", f"must be 1 to {MAX_TRANSFER_ID_BYTES} bytes, got {transfer_id!r}")
    if len(src_block_ids) != len(dst_block_ids):
        raise InvalidArgumentError(
            "dst_block_ids", f"{len(dst_block_ids)} destination ids for {len(src_block_ids)} source blocks"
        )


@dataclass(frozen=True, slots=True)
class TransferStats:
    """One sender-side transfer so far: acked payload bytes and blocks, chunks sent, seconds since the first send
    (until it ended), and the error it ended with, if any."""

    transfer_id: str
    state: TransferState
    num_bytes: int
    num_blocks: int
    num_chunks: int
    duration_s: float
    error: TransferError | None = None


class _Closable:
    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class KVReceiver(_Closable, ABC):
    """Decode side: accepts chunks into reserved blocks of its pool. Owns no blocks, only the write path."""

    layout: KVLayout
    on_released: TransferHook

    @property
    @abstractmethod
    def endpoint(self) -> str:
        """Where senders reach this receiver ("host:port" for the socket backends); goes into the Reserve answer."""

    @abstractmethod
    def expect(self, transfer_id: str, dst_block_ids: Sequence[int], lease_s: float) -> None:
        """Register a reservation of `dst_block_ids` that lapses unless claimed (or fed a chunk) within lease_s."""

    @abstractmethod
    def state(self, transfer_id: str) -> TransferState:
        """The transfer's state; UnknownTransferError once claimed or never reserved."""

    @abstractmethod
    def wait(self, transfer_id: str, timeout_s: float) -> TransferState:
        """Block until DONE/FAILED/EXPIRED/ABORTED or the timeout; return the state then."""

    @abstractmethod
    def claim(self, transfer_id: str) -> None:
        """Decode admitted the request: drop the DONE record (the blocks stay with the engine, no hook fires).
        Raises TransferExpiredError, TransferAbortedError, TransferStateError or UnknownTransferError otherwise."""

    @abstractmethod
    def abort(self, transfer_id: str) -> None:
        """End the reservation now (ABORTED, `on_released` fires); a no-op for unknown or ended transfers."""

    @abstractmethod
    def close(self) -> None:
        """Stop accepting chunks; live reservations end ABORTED and their hooks run before this returns."""


class KVSender(_Closable, ABC):
    """Prefill side: ships blocks of its pool to a receiver. `send` never blocks on the network."""

    layout: KVLayout
    on_finished: TransferHook

    @abstractmethod
    def send(
        self,
        transfer_id: str,
        endpoint: str,
        layout: KVLayout,
        src_block_ids: Sequence[int],
        dst_block_ids: Sequence[int],
        last: bool,
    ) -> None:
        """Enqueue one chunk: src_block_ids[i] of this pool goes to dst_block_ids[i] of the receiver's pool.

        The blocks are copied (or gathered) before this returns; a background worker does the I/O. `layout` is
        the receiver's layout as the reservation announced it: a mismatch with this sender's fails the transfer.
        A chunk of a transfer that already ended is dropped (state() tells why); one after the last chunk raises
        TransferStateError; bad ids raise InvalidArgumentError.
        """

    @abstractmethod
    def state(self, transfer_id: str) -> TransferState:
        """TRANSFERRING from the first send until it ends; UnknownTransferError for ids never sent."""

    @abstractmethod
    def wait(self, transfer_id: str, timeout_s: float) -> TransferState:
        """Block until the transfer ended or the timeout; return the state then."""

    @abstractmethod
    def abort(self, transfer_id: str, endpoint: str | None = None) -> None:
        """End the transfer (ABORTED, `on_finished` fires) and tell the receiver; a no-op once it ended.

        `endpoint` names the receiver of a transfer that may have sent no chunk yet: it is told all the same
        (connecting first if need be) and the id counts as sent, ABORTED. Without it, such an id is a no-op.
        """

    @abstractmethod
    def stats(self, transfer_id: str) -> TransferStats:
        """Bytes and blocks acked so far, chunks sent, duration; UnknownTransferError for ids never sent."""

    @abstractmethod
    def close(self) -> None:
        """Abort live transfers (their hooks run before this returns) and drop the connections."""
