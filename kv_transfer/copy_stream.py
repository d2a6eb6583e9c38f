"""Where the device backends (cuda_ipc, nccl) run their block copies, and how they wait for the blocks' writers.

One `CopyStream` per pool side or connection, chosen once by `make_copy_stream`: a dedicated CUDA stream for a GPU
pool (copies overlap the engine's work), or the calling thread itself for a host pool, where every copy is done when
it returns. The factory gives host pools to `tcp` only; the host stream lets the device backends' protocol run on the
CPU too.

NOTE: a sender reads blocks only after the fence of the work that wrote them; a receiver's writes into reserved
blocks wait for the reservation's fence: everything the engine had queued on its stream when it reserved them (under
async scheduling the engine frees a finished request's blocks while the step in flight may still write that
request's last K/V into one of them, and such a block can be reserved again at once). Nothing the engine queues
after the reservation touches the reserved blocks, so a chunk never waits for the engine's later steps.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

import torch


class Fence(Protocol):
    """A point in a stream's work; `synchronize` blocks the calling thread until the work before it is done."""

    def synchronize(self) -> None: ...


class _Passed:
    """The fence of host work: it was done before the fence existed."""

    def synchronize(self) -> None:
        pass


PASSED: Fence = _Passed()


@dataclass(frozen=True, slots=True)
class MarkedBlocks:
    """A chunk's source blocks as `send` left them: their ids in the pool, and a fence after the engine's work that
    wrote them (nothing may read the blocks before it)."""

    src_block_ids: tuple[int, ...]
    fence: Fence


class CopyStream(ABC):
    @abstractmethod
    def mark(self) -> Fence:
        """A fence after the work queued so far on the calling thread's current stream of the pool's device."""

    @abstractmethod
    def activate(self) -> AbstractContextManager[object]:
        """Make this the calling thread's current stream: the copies queued inside run on it."""

    @abstractmethod
    def wait_for(self, fence: Fence) -> None:
        """Copies queued from now on wait for the work before `fence` (a `mark_stream` of the pool's device): a
        receiver calls it with the reservation's fence before it writes reserved blocks."""

    @abstractmethod
    def synchronize(self) -> None:
        """Block until every copy queued on this stream is done."""


class HostCopyStream(CopyStream):
    def mark(self) -> Fence:
        return PASSED

    def activate(self) -> AbstractContextManager[object]:
        return contextlib.nullcontext()

    def wait_for(self, fence: Fence) -> None:
        fence.synchronize()

    def synchronize(self) -> None:
        pass


class CudaCopyStream(CopyStream):
    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._stream = torch.cuda.Stream(device)

    def mark(self) -> Fence:
        return mark_stream(self._device)

    def activate(self) -> AbstractContextManager[object]:
        return torch.cuda.stream(self._stream)

    def wait_for(self, fence: Fence) -> None:
        if isinstance(fence, torch.cuda.Event):
            self._stream.wait_event(fence)
        else:
            fence.synchronize()

    def synchronize(self) -> None:
        self._stream.synchronize()


def mark_stream(device: torch.device) -> Fence:
    """A fence after the work queued so far on the calling thread's current stream of `device` (passed at once for
    the CPU, whose work is done when queued)."""
    if device.type == "cpu":
        return PASSED
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


def make_copy_stream(device: torch.device) -> CopyStream:
    return HostCopyStream() if device.type == "cpu" else CudaCopyStream(device)
