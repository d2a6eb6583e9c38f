"""The KV transfer contract, how transfers end without a claim: run against every backend (stand-ins aside: their
own modules run the endings where their data planes act)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest
import torch

from kv_transfer import (
    InvalidChunkError,
    TransferAbortedError,
    TransferExpiredError,
    TransferState,
    TransportError,
    UnknownTransferError,
)
from tests.kv_transfer.backends import BACKENDS, open_backend

if TYPE_CHECKING:
    from conftest import Backend, HookRecorder

PoolMaker = Callable[..., torch.Tensor]
LEASE_S = 0.3
WAIT_S = 10.0  # an upper bound: a first nccl contact builds a communicator
SLACK_S = 0.5
S = TransferState


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    yield from open_backend(request)


def _eventually(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while not (holds := predicate()) and time.monotonic() < deadline:
        time.sleep(0.005)
    return holds


def test_unclaimed_reservation_expires_within_lease_and_releases_once(
    backend: Backend, make_pool: PoolMaker, released: HookRecorder
) -> None:
    receiver = backend.receiver(make_pool(8), on_released=released)
    start = time.monotonic()
    receiver.expect("t1", [1, 2], lease_s=LEASE_S)

    assert released.wait_for(1, LEASE_S + SLACK_S) == [("t1", S.EXPIRED)]
    assert LEASE_S <= time.monotonic() - start <= LEASE_S + SLACK_S
    assert receiver.state("t1") is S.EXPIRED
    with pytest.raises(TransferExpiredError):
        receiver.claim("t1")
    time.sleep(0.1)
    assert released.calls == [("t1", S.EXPIRED)]


def test_done_but_unclaimed_transfer_expires(backend: Backend, make_pool: PoolMaker, released: HookRecorder) -> None:
    receiver = backend.receiver(make_pool(8, seed=2), on_released=released)
    sender = backend.sender(make_pool(8, seed=1))
    backend.warm_up(sender, receiver, 7)
    receiver.expect("t1", [1], lease_s=LEASE_S)
    backend.ship(sender, receiver, "t1", [([0], [1])])
    assert receiver.wait("t1", WAIT_S) is S.DONE
    done_at = time.monotonic()

    assert released.wait_for(1, LEASE_S + SLACK_S) == [("t1", S.EXPIRED)]
    assert time.monotonic() - done_at <= LEASE_S + SLACK_S


def test_chunk_after_expiry_is_rejected_and_not_written(
    backend: Backend, make_pool: PoolMaker, released: HookRecorder, finished: HookRecorder
) -> None:
    dst = make_pool(8, seed=2)
    before = dst.clone()
    receiver = backend.receiver(dst, on_released=released)
    sender = backend.sender(make_pool(8, seed=1), on_finished=finished)
    receiver.expect("t1", [1, 2], lease_s=0.1)
    assert released.wait_for(1) == [("t1", S.EXPIRED)]

    backend.ship(sender, receiver, "t1", [([0, 1], [1, 2])])

    assert sender.wait("t1", WAIT_S) is S.EXPIRED
    assert isinstance(sender.stats("t1").error, TransferExpiredError)
    assert sender.stats("t1").num_bytes == 0
    assert finished.wait_for(1) == [("t1", S.EXPIRED)]
    assert torch.equal(dst, before)


def test_chunk_after_receiver_abort_is_rejected_and_not_written(
    backend: Backend, make_pool: PoolMaker, released: HookRecorder, finished: HookRecorder
) -> None:
    dst = make_pool(8, seed=2)
    before = dst.clone()
    receiver = backend.receiver(dst, on_released=released)
    sender = backend.sender(make_pool(8, seed=1), on_finished=finished)
    receiver.expect("t1", [1, 2], lease_s=5.0)
    receiver.abort("t1")
    assert receiver.state("t1") is S.ABORTED

    backend.ship(sender, receiver, "t1", [([0, 1], [1, 2])])

    assert sender.wait("t1", WAIT_S) is S.ABORTED
    assert isinstance(sender.stats("t1").error, TransferAbortedError)
    assert finished.wait_for(1) == [("t1", S.ABORTED)]
    assert released.wait_for(1) == [("t1", S.ABORTED)]
    assert torch.equal(dst, before)


def test_chunk_for_unknown_transfer_is_rejected(backend: Backend, make_pool: PoolMaker) -> None:
    dst = make_pool(8, seed=2)
    before = dst.clone()
    receiver = backend.receiver(dst)
    sender = backend.sender(make_pool(8, seed=1))

    backend.ship(sender, receiver, "nobody", [([0], [1])])

    assert sender.wait("nobody", WAIT_S) is S.FAILED
    assert isinstance(sender.stats("nobody").error, UnknownTransferError)
    assert torch.equal(dst, before)


def test_chunk_outside_the_reservation_fails_the_transfer(
    backend: Backend, make_pool: PoolMaker, released: HookRecorder
) -> None:
    dst = make_pool(8, seed=2)
    before = dst.clone()
    receiver = backend.receiver(dst, on_released=released)
    sender = backend.sender(make_pool(8, seed=1))
    receiver.expect("t1", [1, 2], lease_s=5.0)

    backend.ship(sender, receiver, "t1", [([0, 1], [1, 5])])

    assert sender.wait("t1", WAIT_S) is S.FAILED
    assert isinstance(sender.stats("t1").error, InvalidChunkError)
    assert released.wait_for(1) == [("t1", S.FAILED)]
    assert torch.equal(dst, before)


def test_last_chunk_must_complete_the_reservation(
    backend: Backend, make_pool: PoolMaker, released: HookRecorder
) -> None:
    receiver = backend.receiver(make_pool(8, seed=2), on_released=released)
    sender = backend.sender(make_pool(8, seed=1))
    receiver.expect("t1", [1, 2, 3], lease_s=5.0)

    backend.ship(sender, receiver, "t1", [([0], [1]), ([1], [3])])

    assert sender.wait("t1", WAIT_S) is S.FAILED
    assert "[2]" in str(sender.stats("t1").error)
    assert released.wait_for(1) == [("t1", S.FAILED)]


def test_sender_abort_reaches_the_receiver(
    backend: Backend, make_pool: PoolMaker, released: HookRecorder, finished: HookRecorder
) -> None:
    dst = make_pool(8, seed=2)
    receiver = backend.receiver(dst, on_released=released)
    sender = backend.sender(make_pool(8, seed=1), on_finished=finished)
    receiver.expect("t1", [1, 2], lease_s=5.0)
    sender.send("t1", receiver.endpoint, receiver.layout, [0], [1], last=False)
    assert _eventually(lambda: receiver.state("t1") is S.TRANSFERRING)

    sender.abort("t1")

    assert sender.state("t1") is S.ABORTED
    assert receiver.wait("t1", WAIT_S) is S.ABORTED
    assert released.wait_for(1) == [("t1", S.ABORTED)]
    assert finished.wait_for(1) == [("t1", S.ABORTED)]
    before = dst.clone()
    sender.send("t1", receiver.endpoint, receiver.layout, [1], [2], last=True)  # dropped: the transfer ended
    assert sender.state("t1") is S.ABORTED
    assert sender.stats("t1").num_chunks == 1
    assert torch.equal(dst, before)


def test_sender_abort_before_the_first_chunk_reaches_the_receiver(
    backend: Backend, make_pool: PoolMaker, released: HookRecorder, finished: HookRecorder
) -> None:
    dst = make_pool(8, seed=2)
    before = dst.clone()
    receiver = backend.receiver(dst, on_released=released)
    sender = backend.sender(make_pool(8, seed=1), on_finished=finished)
    receiver.expect("t1", [1, 2], lease_s=60.0)

    sender.abort("t1", receiver.endpoint)  # no chunk went yet (nor, for the socket backends, any connection)

    assert sender.state("t1") is S.ABORTED
    # NOTE: bounded by the first contact (WAIT_S: nccl builds a communicator), far below the 60 s lease.
    assert released.wait_for(1, WAIT_S) == [("t1", S.ABORTED)]
    assert receiver.state("t1") is S.ABORTED
    assert finished.wait_for(1) == [("t1", S.ABORTED)]
    sender.send("t1", receiver.endpoint, receiver.layout, [0, 1], [1, 2], last=True)  # dropped: the transfer ended
    assert sender.stats("t1").num_chunks == 0
    assert torch.equal(dst, before)


def test_sender_lease_expires_when_the_receiver_never_acks(
    backend: Backend, make_pool: PoolMaker, finished: HookRecorder, silent_endpoint: str
) -> None:
    sender = backend.sender(make_pool(8, seed=1), lease_s=LEASE_S, on_finished=finished)
    start = time.monotonic()
    sender.send("t1", silent_endpoint, sender.layout, [0], [1], last=True)

    assert finished.wait_for(1, LEASE_S + SLACK_S) == [("t1", S.EXPIRED)]
    assert LEASE_S <= time.monotonic() - start <= LEASE_S + SLACK_S
    assert sender.state("t1") is S.EXPIRED
    assert isinstance(sender.stats("t1").error, TransferExpiredError)


def test_sender_fails_when_the_receiver_is_gone(
    backend: Backend, make_pool: PoolMaker, released: HookRecorder, finished: HookRecorder
) -> None:
    receiver = backend.receiver(make_pool(8, seed=2), on_released=released)
    sender = backend.sender(make_pool(8, seed=1), on_finished=finished)
    receiver.expect("t1", [1], lease_s=5.0)
    receiver.close()
    assert released.calls == [("t1", S.ABORTED)]  # close() runs the hooks before it returns

    backend.ship(sender, receiver, "t1", [([0], [1])])

    assert sender.wait("t1", WAIT_S) is S.FAILED
    assert isinstance(sender.stats("t1").error, TransportError)
    assert finished.wait_for(1) == [("t1", S.FAILED)]


def test_receiver_close_aborts_live_reservations(
    backend: Backend, make_pool: PoolMaker, released: HookRecorder
) -> None:
    receiver = backend.receiver(make_pool(8), on_released=released)
    receiver.expect("a", [1], lease_s=5.0)
    receiver.expect("b", [2], lease_s=5.0)

    receiver.close()

    assert sorted(released.calls) == [("a", S.ABORTED), ("b", S.ABORTED)]
