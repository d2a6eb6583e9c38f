"""The communicator of one nccl sender-receiver pair: two ranks, rank 0 sends and rank 1 receives."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Protocol, cast

import torch
import torch.distributed as dist

from kv_transfer.control.frames import KeepWaiting
from kv_transfer.state import TransportError

SENDER_RANK = 0
RECEIVER_RANK = 1
_POLL_S = 50e-6
_CHECK_EVERY_S = 0.01


class PairGroup(ABC):
    @abstractmethod
    def send(self, tensor: torch.Tensor) -> None:
        """Queue sending `tensor` to the receiver, after the work queued so far on the current stream; the tensor
        stays untouched until the receiver has it."""

    @abstractmethod
    def recv(self, tensor: torch.Tensor, keep_waiting: KeepWaiting) -> None:
        """Fill `tensor` from the sender; returns once it holds the bytes. While they are late, `keep_waiting()` says
        whether to go on (False: TransportError)."""

    @abstractmethod
    def close(self) -> None:
        """Abort the communicator: a send or receive still waiting on the peer ends."""


GroupFactory = Callable[[dist.Store, int], PairGroup]


class _PointToPoint(Protocol):
    def send(self, tensors: list[torch.Tensor], peer: int, tag: int, /) -> dist.Work: ...

    def recv(self, tensors: list[torch.Tensor], peer: int, tag: int, /) -> dist.Work: ...

    def abort(self) -> None: ...


def wait_until(done: Callable[[], bool], keep_waiting: KeepWaiting) -> None:
    """Poll `done` until it holds, asking `keep_waiting` every few milliseconds (False: TransportError)."""
    next_check = time.monotonic() + _CHECK_EVERY_S
    while not done():
        if time.monotonic() >= next_check:
            if not keep_waiting():
                raise TransportError("gave up waiting for the sender's NCCL send")
            next_check = time.monotonic() + _CHECK_EVERY_S
        time.sleep(_POLL_S)


class NcclPairGroup(PairGroup):
    """A two-rank ProcessGroupNCCL built straight on the pair's store: no global `init_process_group`, since pods
    come and go at run time. Its kernels run on NCCL's own stream; the NCCL communicator is created by the first
    send (rank 0) and receive (rank 1)."""

    def __init__(self, store: dist.Store, rank: int) -> None:
        if not dist.is_nccl_available():
            raise TransportError("this build of torch has no NCCL")
        from torch.distributed import ProcessGroupNCCL  # NOTE: CPU builds of torch do not have it

        self._group = cast(_PointToPoint, ProcessGroupNCCL(store, rank, 2, ProcessGroupNCCL.Options()))
        self._peer = 1 - rank

    def send(self, tensor: torch.Tensor) -> None:
        self._group.send([tensor], self._peer, 0)

    def recv(self, tensor: torch.Tensor, keep_waiting: KeepWaiting) -> None:
        # NOTE: polled rather than waited on, so that a dead sender cannot hold this thread (or the copy stream,
        # which never depends on NCCL's) past the reservation's lease.
        work = self._group.recv([tensor], self._peer, 0)
        wait_until(work.is_completed, keep_waiting)

    def close(self) -> None:
        self._group.abort()
