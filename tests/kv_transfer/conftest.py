"""Fixtures for the kv_transfer tests: small random pools, hook recorders, backends that close themselves."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from kv_transfer import KVReceiver, KVSender, TransferState, TransportError, make_receiver, make_sender
from kv_transfer.in_process import InProcessReceiver

BLOCK_SIZE = 4
POOL_SHAPE = (2, 2, BLOCK_SIZE, 2, 8)  # num_layers, K/V, block_size, num_kv_heads, head_dim


def random_pool(num_blocks: int, dtype: torch.dtype = torch.float32, seed: int = 0, head_dim: int = 8) -> torch.Tensor:
    """A pool [num_blocks, 2 layers, K/V, block_size 4, 2 kv heads, head_dim] of random values."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((num_blocks, *POOL_SHAPE[:-1], head_dim), generator=generator).to(dtype)


class HookRecorder:
    """A hook that records its calls and lets a test wait for them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, TransferState]] = []
        self._cond = threading.Condition()

    def __call__(self, transfer_id: str, state: TransferState) -> None:
        with self._cond:
            self.calls.append((transfer_id, state))
            self._cond.notify_all()

    def wait_for(self, count: int = 1, timeout_s: float = 2.0) -> list[tuple[str, TransferState]]:
        with self._cond:
            self._cond.wait_for(lambda: len(self.calls) >= count, timeout_s)
            return list(self.calls)


class Backend:
    """Builds senders and receivers of one backend and closes them all at teardown."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._opened: list[KVSender | KVReceiver] = []

    def receiver(self, pool: torch.Tensor, **kwargs: Any) -> KVReceiver:
        receiver = make_receiver(self.name, pool, BLOCK_SIZE, **kwargs)
        self._opened.append(receiver)
        return receiver

    def sender(self, pool: torch.Tensor, **kwargs: Any) -> KVSender:
        sender = make_sender(self.name, pool, BLOCK_SIZE, **kwargs)
        self._opened.append(sender)
        return sender

    @staticmethod
    def ship(
        sender: KVSender, receiver: KVReceiver, transfer_id: str, chunks: list[tuple[list[int], list[int]]]
    ) -> None:
        """Send chunks (src ids, dst ids) in order, the last one marked last."""
        for i, (src, dst) in enumerate(chunks):
            sender.send(transfer_id, receiver.endpoint, receiver.layout, src, dst, last=i == len(chunks) - 1)

    def close(self) -> None:
        for opened in reversed(self._opened):
            opened.close()


@pytest.fixture(params=["in_process", "tcp"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    built = Backend(request.param)
    yield built
    built.close()


@pytest.fixture
def make_pool() -> Callable[..., torch.Tensor]:
    """`random_pool(num_blocks, dtype=float32, seed=0, head_dim=8)`."""
    return random_pool


@pytest.fixture
def released() -> HookRecorder:
    """Records a receiver's `on_released` calls."""
    return HookRecorder()


@pytest.fixture
def finished() -> HookRecorder:
    """Records a sender's `on_finished` calls."""
    return HookRecorder()


class _StuckReceiver(InProcessReceiver):
    """An in-process receiver whose deliveries hang until `release` is set: it never acks."""

    def __init__(self, pool: torch.Tensor, release: threading.Event) -> None:
        super().__init__(pool, BLOCK_SIZE)
        self._release = release

    def deliver(self, transfer_id: str, dst_block_ids: Sequence[int], blocks: np.ndarray, last: bool) -> None:
        self._release.wait(10.0)
        raise TransportError("stuck receiver released")


@pytest.fixture
def silent_endpoint(backend: Backend) -> Iterator[str]:
    """An endpoint of the backend that takes chunks but never acks (layout: `random_pool`'s)."""
    if backend.name == "tcp":
        # NOTE: it listens but never accepts, so the kernel completes connect() and the handshake gets no answer.
        with socket.create_server(("127.0.0.1", 0)) as listener:
            yield f"127.0.0.1:{listener.getsockname()[1]}"
        return
    release = threading.Event()
    receiver = _StuckReceiver(random_pool(4), release)
    yield receiver.endpoint
    release.set()
    receiver.close()
