"""One sender's connection to a SocketReceiver, served on its own thread."""

from __future__ import annotations

import logging
import select
import socket
from collections.abc import Callable
from dataclasses import dataclass

from kv_transfer.bookkeeping.reservation_table import ReservationTable
from kv_transfer.control.data_plane import ReceiverLink, ReceiverPlane
from kv_transfer.control.frames import FrameHead, FrameType, Hello, discard, encode_error_frame, read_head, read_hello
from kv_transfer.copy_stream import Fence
from kv_transfer.layout import KVLayout, check_transfer_layouts
from kv_transfer.state import LayoutMismatchError, ProtocolError, TransferError

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Landing:
    """A chunk begun (`ReceiverLink.start`) and not answered yet: its writes end when `done` passes."""

    head: FrameHead
    done: Fence


class ReceiverConnection:
    """The handshake, then chunks landed by the data plane's link in their reserved blocks, each answered by ACK or
    ERROR, in order.

    A chunk whose copy the link queued on a device stream (`queues_copies`) stays open (`_landing`) while the next
    frame is read and its copy queued behind it, if that frame has already arrived; otherwise (or before anything
    else is sent) the open chunk is waited for, ended in the reservation table and answered. So at most two chunks
    are in flight, and the device does not idle for this connection's host work between chunks that arrive back to
    back (on 2 H200s that work was ~0.5 ms per 302 MB chunk, against ~0.9 ms of copying).

    NOTE: the socket has a short timeout, so a read waiting on a stalled sender re-checks, on each tick, that the
    receiver is still open and the chunk's reservation still writable; otherwise it gives up and drops the
    connection, so an expiry or abort releases the blocks within that tick even mid-chunk. Links that wait on
    another data plane poll the same check.
    """

    def __init__(
        self,
        sock: socket.socket,
        layout: KVLayout,
        table: ReservationTable,
        plane: ReceiverPlane,
        is_closing: Callable[[], bool],
    ) -> None:
        self._sock = sock
        self._layout = layout
        self._table = table
        self._plane = plane
        self._is_closing = is_closing
        self._landing: _Landing | None = None

    def run(self) -> None:
        link: ReceiverLink | None = None
        try:
            link = self._handshake()
            while link is not None:
                if self._landing is not None and not self._frame_waiting():
                    self._answer_landing()
                self._serve(link, read_head(self._sock, self._keep_open))
        except (TransferError, OSError) as error:
            logger.debug("kv receiver connection ends: %s", error)
        except Exception:
            logger.exception("kv receiver connection failed")
        finally:
            self._end_landing_quietly()
            if link is not None:
                link.close()
            self._sock.close()

    def _keep_open(self) -> bool:
        return not self._is_closing()

    def _keeps_writing(self, transfer_id: str) -> bool:
        return self._keep_open() and self._table.is_writable(transfer_id)

    def _handshake(self) -> ReceiverLink | None:
        """The link to the sender, or None when it is refused: a sender of another backend or with a plane the
        receiver cannot serve gets an ERROR; one with another layout gets our HELLO, to name what differs."""
        head = read_head(self._sock, self._keep_open)
        if head.kind is not FrameType.HELLO:
            raise ProtocolError(f"expected HELLO first, got {head.kind.name}")
        hello = read_hello(self._sock, head, self._keep_open)
        try:
            if hello.backend != self._plane.backend:
                raise ProtocolError(
                    f"this KV receiver runs the {self._plane.backend!r} backend, the sender {hello.backend!r}"
                )
            check_transfer_layouts(hello.layout, self._layout)
            link = self._plane.accept(hello.plane)
        except LayoutMismatchError as error:
            logger.warning("kv receiver refuses a sender: %s", error)
            self._sock.sendall(Hello(self._plane.backend, self._layout, {}).encode())
            return None
        except TransferError as error:
            logger.warning("kv receiver refuses a sender: %s", error)
            self._sock.sendall(encode_error_frame(0, "", error))
            return None
        self._sock.sendall(Hello(self._plane.backend, self._layout, link.answer).encode())
        return link

    def _serve(self, link: ReceiverLink, head: FrameHead) -> None:
        if head.kind is FrameType.CHUNK:
            self._on_chunk(link, head)
        elif head.kind is FrameType.ABORT:
            discard(self._sock, head.payload_nbytes, self._keep_open)
            self._table.abort(head.transfer_id)
        else:
            raise ProtocolError(f"unexpected {head.kind.name} frame from a sender")

    def _on_chunk(self, link: ReceiverLink, head: FrameHead) -> None:
        link.check(head)
        try:
            fence = self._table.begin_chunk(head.transfer_id, head.block_ids)
        except TransferError as error:
            self._answer_landing()
            link.drop(self._sock, head, self._keep_open)
            self._sock.sendall(encode_error_frame(head.seq, head.transfer_id, error))
            return
        try:
            done = link.start(self._sock, head, lambda: self._keeps_writing(head.transfer_id), fence)
        except BaseException:
            # NOTE: the open chunk is answered first (in order); this one's write ends incomplete.
            self._end_landing_quietly()
            self._table.end_chunk(head.transfer_id, head.block_ids, head.last, complete=False)
            raise
        self._answer_landing()
        self._landing = _Landing(head, done)
        if not link.queues_copies:
            self._answer_landing()

    def _answer_landing(self) -> None:
        """Wait for the open chunk's writes, end it in the table and send its ACK (or ERROR)."""
        landing, self._landing = self._landing, None
        if landing is None:
            return
        head = landing.head
        complete = False
        try:
            landing.done.synchronize()
            complete = True
        finally:
            rejection = self._table.end_chunk(head.transfer_id, head.block_ids, head.last, complete)
        if rejection is None:
            self._sock.sendall(FrameHead(FrameType.ACK, head.seq, head.transfer_id).encode())
        else:
            self._sock.sendall(encode_error_frame(head.seq, head.transfer_id, rejection))

    def _end_landing_quietly(self) -> None:
        """The connection is failing: the open chunk's writes still end (after its copy) before its blocks can be
        released; its answer is best effort."""
        try:
            self._answer_landing()
        except Exception as error:
            logger.debug("kv receiver: the open chunk's answer was not sent: %s", error)

    def _frame_waiting(self) -> bool:
        """Whether the next frame's first bytes are here already (a TLS socket may hold decrypted ones)."""
        pending = getattr(self._sock, "pending", None)
        if pending is not None and pending() > 0:
            return True
        readable, _, _ = select.select([self._sock], [], [], 0)
        return bool(readable)
