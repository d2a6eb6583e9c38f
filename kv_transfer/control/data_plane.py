"""How a chunk's bytes travel once its CHUNK frame went over the control connection: one data plane per backend.

The socket sender and receiver (ledger, leases, connections, frames, acks) are the same for tcp, cuda_ipc and nccl;
each backend plugs in a pair of planes:
- sender side: `stage` captures a chunk in `send` (a host copy, or the block ids and a fence), and per connection a
  `SenderLink` writes the CHUNK frame and moves the bytes;
- receiver side: `accept` checks a sender's HELLO fields and opens a `ReceiverLink` that validates each CHUNK frame,
  lands its bytes in the reserved blocks, or drains them when the chunk is refused.
"""

from __future__ import annotations

import socket
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Generic, TypeVar

from kv_transfer.control.frames import FrameHead, KeepWaiting
from kv_transfer.copy_stream import PASSED, Fence

Staged = TypeVar("Staged")


class SenderLink(ABC, Generic[Staged]):
    """One connection's sending side of the data plane; used from that connection's writer thread only."""

    @abstractmethod
    def write(self, sock: socket.socket, head: FrameHead, staged: Staged) -> None:
        """Send the CHUNK frame `head` (adding this plane's fields) and move the chunk's bytes after it."""

    def close(self) -> None:
        """The connection ended: release what the link holds."""


class SenderPlane(ABC, Generic[Staged]):
    """A sender's data plane over its pool."""

    backend: ClassVar[str]

    def hello(self) -> dict[str, Any]:
        """This plane's fields of the sender's HELLO."""
        return {}

    @abstractmethod
    def stage(self, src_block_ids: Sequence[int]) -> Staged:
        """Capture a chunk in `send`, on the caller's thread: what the link needs to move it later."""

    @abstractmethod
    def link(self, host: str, answer: dict[str, Any]) -> SenderLink[Staged]:
        """The link of a new connection to `host`, whose receiver answered the HELLO with plane fields `answer`."""

    def close(self) -> None:
        """The sender closed."""


class ReceiverLink(ABC):
    """One connection's receiving side of the data plane; used from that connection's thread only."""

    queues_copies: ClassVar[bool] = False
    """Whether `start` returns with the chunk's copy still queued on a device stream (else it has landed)."""

    @property
    def answer(self) -> dict[str, Any]:
        """This plane's fields of the receiver's HELLO."""
        return {}

    @abstractmethod
    def check(self, head: FrameHead) -> None:
        """Raise ProtocolError if the CHUNK frame does not fit this plane (the connection is closed then)."""

    @abstractmethod
    def land(self, sock: socket.socket, head: FrameHead, keep_waiting: KeepWaiting, fence: Fence) -> None:
        """Move the chunk's bytes into its destination blocks, after `fence` (the reservation's: the engine's work
        that may still touch them); when this returns, they are there. While the bytes are late, `keep_waiting()`
        says whether to go on (False: give up with a TransferError)."""

    def start(self, sock: socket.socket, head: FrameHead, keep_waiting: KeepWaiting, fence: Fence) -> Fence:
        """Begin landing the chunk (as `land`) and return a fence after its writes: the bytes are in their blocks
        once it is passed. By default the chunk lands at once; a link whose copies run on a device stream returns
        with them queued, so that the connection reads and starts the next chunk while they run."""
        self.land(sock, head, keep_waiting, fence)
        return PASSED

    @abstractmethod
    def drop(self, sock: socket.socket, head: FrameHead, keep_waiting: KeepWaiting) -> None:
        """Drain the bytes of a refused chunk without writing them anywhere."""

    def close(self) -> None:  # noqa: B027 (a no-op unless the link holds something)
        """The connection ended: release what the link holds."""


class ReceiverPlane(ABC):
    """A receiver's data plane into its pool."""

    backend: ClassVar[str]

    @abstractmethod
    def accept(self, hello: dict[str, Any]) -> ReceiverLink:
        """The link to a sender whose HELLO carried plane fields `hello`; raise a TransferError to refuse it."""

    def close(self) -> None:  # noqa: B027 (a no-op unless the plane holds something)
        """The receiver closed."""
