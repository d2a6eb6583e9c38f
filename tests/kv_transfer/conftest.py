"""Fixtures for the kv_transfer tests: small random pools, hook recorders, backends that close themselves.

The `backend` fixture runs a test against every backend: in_process and tcp; cuda_ipc and nccl on GPUs (`gpu`
marker; nccl needs two); and stand-ins that run the protocol of those two on host pools (cuda_ipc's same-process
path, nccl's pair over gloo), so that it runs where no GPU is.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pytest
import torch

from kv_transfer import TransferState, TransportError
from kv_transfer.in_process import InProcessReceiver
from tests.kv_transfer.backends import BACKENDS, STAND_INS, Backend, open_backend
from tests.kv_transfer.pools import BLOCK_SIZE, random_pool


class HookRecorder:
    """A hook that records its calls and lets a test wait for them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, TransferState]] = []
        self._cond = threading.Condition()

    def __call__(self, transfer_id: str, state: TransferState) -> None:
        with self._cond:
            self.calls.append((transfer_id, state))
            self._cond.notify_all()

    def wait_for(self, count: int = 1, timeout_s: float = 10.0) -> list[tuple[str, TransferState]]:
        with self._cond:
            self._cond.wait_for(lambda: len(self.calls) >= count, timeout_s)
            return list(self.calls)


@pytest.fixture(params=[*BACKENDS, *STAND_INS])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    yield from open_backend(request)


@pytest.fixture
def make_pool(request: pytest.FixtureRequest) -> Callable[..., torch.Tensor]:
    """`random_pool(num_blocks, dtype=float32, seed=0, head_dim=8)`, on the receiver's device of the test's backend."""
    if "backend" not in request.fixturenames:
        return random_pool
    device = request.getfixturevalue("backend").receiver_device
    return lambda *args, **kwargs: random_pool(*args, **kwargs).to(device)


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
    if backend.name != "in_process":
        # NOTE: it listens but never accepts, so the kernel completes connect() and the handshake gets no answer.
        with socket.create_server(("127.0.0.1", 0)) as listener:
            yield f"127.0.0.1:{listener.getsockname()[1]}"
        return
    release = threading.Event()
    receiver = _StuckReceiver(random_pool(4), release)
    yield receiver.endpoint
    release.set()
    receiver.close()
