"""The backends the kv_transfer tests run against, and how each builds its senders and receivers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from kv_transfer import KVPoolView, KVReceiver, KVSender, TransferState, make_receiver, make_sender
from kv_transfer.cuda_ipc import CudaIpcReceiver, CudaIpcSender
from kv_transfer.layout import KVRank
from tests.kv_transfer.gloo_pair_group import GlooNcclReceiver, GlooNcclSender
from tests.kv_transfer.pools import BLOCK_SIZE

needs_two_gpus = pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs 2 CUDA devices (NCCL cannot put both ranks of a pair on one GPU)"
)


@dataclass(frozen=True)
class BackendKind:
    """How to build one backend's senders and receivers (`pool, **options`; `rank=KVRank(...)` for a parallel pod's
    rank), and where their pools live."""

    name: str
    make_sender: Callable[..., KVSender]
    make_receiver: Callable[..., KVReceiver]
    sender_device: str = "cpu"
    receiver_device: str = "cpu"


def _by_name(name: str, sender_device: str = "cpu", receiver_device: str = "cpu") -> BackendKind:
    return BackendKind(
        name,
        lambda pool, rank=None, **options: make_sender(name, KVPoolView(pool, BLOCK_SIZE, rank or KVRank()), **options),
        lambda pool, rank=None, **options: make_receiver(
            name, KVPoolView(pool, BLOCK_SIZE, rank or KVRank()), **options
        ),
        sender_device,
        receiver_device,
    )


def _on_host(name: str, sender: Callable[..., KVSender], receiver: Callable[..., KVReceiver]) -> BackendKind:
    """A device backend's classes on host pools, past the factory (which refuses those)."""
    return BackendKind(
        name,
        lambda pool, **options: sender(pool, BLOCK_SIZE, **options),
        lambda pool, **options: receiver(pool, BLOCK_SIZE, **options),
    )


BACKEND_KINDS = {
    "in_process": _by_name("in_process"),
    "tcp": _by_name("tcp"),
    "cuda_ipc-on-host": _on_host("cuda_ipc", CudaIpcSender, CudaIpcReceiver),
    "nccl-over-gloo": _on_host("nccl", GlooNcclSender, GlooNcclReceiver),
    "cuda_ipc": _by_name("cuda_ipc", "cuda:0", "cuda:0"),
    "nccl": _by_name("nccl", "cuda:0", "cuda:1"),
}


class Backend:
    """Builds senders and receivers of one backend and closes them all at teardown. Test pools (`make_pool`) are on
    the receiver's device; a sender works on a copy of its pool on its own device where that differs."""

    def __init__(self, kind: BackendKind) -> None:
        self.name = kind.name
        self.receiver_device = torch.device(kind.receiver_device)
        self._kind = kind
        self._opened: list[KVSender | KVReceiver] = []

    def receiver(self, pool: torch.Tensor, **kwargs: Any) -> KVReceiver:
        receiver = self._kind.make_receiver(pool, **kwargs)
        self._opened.append(receiver)
        return receiver

    def sender(self, pool: torch.Tensor, **kwargs: Any) -> KVSender:
        sender = self._kind.make_sender(pool.to(self._kind.sender_device), **kwargs)
        self._opened.append(sender)
        return sender

    @staticmethod
    def ship(
        sender: KVSender, receiver: KVReceiver, transfer_id: str, chunks: list[tuple[list[int], list[int]]]
    ) -> None:
        """Send chunks (src ids, dst ids) in order, the last one marked last."""
        for i, (src, dst) in enumerate(chunks):
            sender.send(transfer_id, receiver.endpoint, receiver.layout, src, dst, last=i == len(chunks) - 1)

    @staticmethod
    def warm_up(sender: KVSender, receiver: KVReceiver, block_id: int) -> None:
        """A throwaway one-block transfer into `block_id`, so that a first contact's set-up (nccl builds the pair's
        communicator: up to a second or so) does not eat a short lease timed after it."""
        receiver.expect("warm-up", [block_id], lease_s=10.0)
        sender.send("warm-up", receiver.endpoint, receiver.layout, [0], [block_id], last=True)
        assert receiver.wait("warm-up", 10.0) is TransferState.DONE
        receiver.claim("warm-up")

    def close(self) -> None:
        for opened in reversed(self._opened):
            opened.close()


# NOTE: the stand-ins run the device backends' protocol on host pools; the contract's data path runs on them too
# (test_transfer_contract), the lease and ending rules only on the backends themselves (test_transfer_endings).
BACKENDS = [
    "in_process",
    "tcp",
    pytest.param("cuda_ipc", marks=pytest.mark.gpu),
    pytest.param("nccl", marks=[pytest.mark.gpu, needs_two_gpus]),
]
STAND_INS = ["cuda_ipc-on-host", "nccl-over-gloo"]


def open_backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    built = Backend(BACKEND_KINDS[request.param])
    yield built
    built.close()
