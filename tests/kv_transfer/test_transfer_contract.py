"""The KV transfer contract, data path: run against every backend (`backend` fixture: in_process, tcp)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
import torch

from kv_transfer import LayoutMismatchError, TransferState, TransferStateError, UnknownTransferError

if TYPE_CHECKING:
    from conftest import Backend, HookRecorder

PoolMaker = Callable[..., torch.Tensor]
LEASE_S = 0.3
WAIT_S = 10.0  # an upper bound: a first nccl contact builds a communicator
S = TransferState


def _eventually(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while not (holds := predicate()) and time.monotonic() < deadline:
        time.sleep(0.005)
    return holds


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunks_land_bit_exact_at_their_ids_and_nothing_else_changes(
    backend: Backend, make_pool: PoolMaker, finished: HookRecorder, dtype: torch.dtype
) -> None:
    src, dst = make_pool(10, dtype, seed=1), make_pool(12, dtype, seed=2)
    before = dst.clone()
    receiver = backend.receiver(dst)
    sender = backend.sender(src, on_finished=finished)
    receiver.expect("t1", [7, 2, 9, 4, 0], lease_s=5.0)

    backend.ship(sender, receiver, "t1", [([3, 0], [7, 2]), ([8, 5], [9, 4]), ([6], [0])])

    assert sender.wait("t1", WAIT_S) is S.DONE
    assert receiver.wait("t1", WAIT_S) is S.DONE
    assert torch.equal(dst[[7, 2, 9, 4, 0]].view(torch.uint8), src[[3, 0, 8, 5, 6]].view(torch.uint8))
    untouched = [b for b in range(12) if b not in (7, 2, 9, 4, 0)]
    assert torch.equal(dst[untouched].view(torch.uint8), before[untouched].view(torch.uint8))
    stats = sender.stats("t1")
    assert (stats.state, stats.num_bytes, stats.num_blocks, stats.num_chunks) == (
        S.DONE,
        5 * 256 * dtype.itemsize,
        5,
        3,
    )
    assert stats.error is None and stats.duration_s > 0
    assert finished.wait_for(1) == [("t1", S.DONE)]


def test_states_go_reserved_transferring_done(backend: Backend, make_pool: PoolMaker) -> None:
    receiver = backend.receiver(make_pool(8, seed=2))
    sender = backend.sender(make_pool(8, seed=1))
    receiver.expect("t1", [1, 2], lease_s=5.0)
    assert receiver.state("t1") is S.RESERVED

    sender.send("t1", receiver.endpoint, receiver.layout, [0], [1], last=False)
    assert sender.state("t1") is S.TRANSFERRING
    assert _eventually(lambda: receiver.state("t1") is S.TRANSFERRING)
    assert _eventually(lambda: sender.stats("t1").num_blocks == 1)
    assert sender.state("t1") is S.TRANSFERRING

    sender.send("t1", receiver.endpoint, receiver.layout, [1], [2], last=True)
    assert sender.wait("t1", WAIT_S) is S.DONE
    assert receiver.wait("t1", WAIT_S) is S.DONE


def test_handshake_layout_mismatch_fails_before_any_byte(
    backend: Backend, make_pool: PoolMaker, finished: HookRecorder
) -> None:
    dst = make_pool(8, seed=2, head_dim=16)
    before = dst.clone()
    receiver = backend.receiver(dst)
    sender = backend.sender(make_pool(8, seed=1), on_finished=finished)
    receiver.expect("t1", [3], lease_s=5.0)

    # The announced layout is (wrongly) the sender's own, so only the handshake can catch the mismatch.
    sender.send("t1", receiver.endpoint, sender.layout, [0], [3], last=True)

    assert sender.wait("t1", WAIT_S) is S.FAILED
    error = sender.stats("t1").error
    assert isinstance(error, LayoutMismatchError) and error.fields == ("head_dim",)
    assert finished.wait_for(1) == [("t1", S.FAILED)]
    assert torch.equal(dst, before)
    assert receiver.state("t1") is S.RESERVED


def test_announced_layout_mismatch_fails_at_send(
    backend: Backend, make_pool: PoolMaker, finished: HookRecorder
) -> None:
    dst = make_pool(8, torch.bfloat16, seed=2)
    before = dst.clone()
    receiver = backend.receiver(dst)
    sender = backend.sender(make_pool(8, torch.float32, seed=1), on_finished=finished)
    receiver.expect("t1", [3], lease_s=5.0)

    sender.send("t1", receiver.endpoint, receiver.layout, [0], [3], last=True)

    assert sender.state("t1") is S.FAILED
    error = sender.stats("t1").error
    assert isinstance(error, LayoutMismatchError) and error.fields == ("dtype",)
    assert finished.wait_for(1) == [("t1", S.FAILED)]
    assert torch.equal(dst, before)


def test_claim_of_done_transfer_drops_the_record(
    backend: Backend, make_pool: PoolMaker, released: HookRecorder
) -> None:
    receiver = backend.receiver(make_pool(8, seed=2), on_released=released)
    sender = backend.sender(make_pool(8, seed=1))
    backend.warm_up(sender, receiver, 7)
    receiver.expect("t1", [1, 2], lease_s=LEASE_S)
    with pytest.raises(TransferStateError):
        receiver.claim("t1")
    backend.ship(sender, receiver, "t1", [([0, 1], [1, 2])])
    assert receiver.wait("t1", WAIT_S) is S.DONE

    receiver.claim("t1")

    with pytest.raises(UnknownTransferError):
        receiver.state("t1")
    with pytest.raises(UnknownTransferError):
        receiver.claim("t1")
    receiver.abort("t1")  # a no-op once claimed
    time.sleep(LEASE_S + 0.1)
    assert released.calls == []


def test_concurrent_transfers_from_two_senders_do_not_interleave(backend: Backend, make_pool: PoolMaker) -> None:
    dst = make_pool(40, seed=9)
    receiver = backend.receiver(dst)
    sources = [make_pool(16, seed=10), make_pool(16, seed=11)]
    senders = [backend.sender(pool) for pool in sources]
    plan: dict[str, tuple[int, list[int], list[int]]] = {}
    for s, t in ((s, t) for s in range(2) for t in range(3)):
        transfer_id = f"s{s}-t{t}"
        dst_ids = [s * 18 + t * 6 + i for i in range(6)]
        src_ids = [(t * 5 + i) % 16 for i in range(6)]
        plan[transfer_id] = (s, src_ids, dst_ids)
        receiver.expect(transfer_id, dst_ids, lease_s=5.0)

    def run(s: int) -> None:
        mine = [(tid, src, dst_ids) for tid, (owner, src, dst_ids) in plan.items() if owner == s]
        for chunk in range(3):
            for tid, src, dst_ids in mine:
                part = slice(2 * chunk, 2 * chunk + 2)
                senders[s].send(tid, receiver.endpoint, receiver.layout, src[part], dst_ids[part], last=chunk == 2)

    threads = [threading.Thread(target=run, args=(s,)) for s in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    for tid, (s, src_ids, dst_ids) in plan.items():
        assert senders[s].wait(tid, WAIT_S) is S.DONE
        assert receiver.wait(tid, WAIT_S) is S.DONE
        assert torch.equal(dst[dst_ids], sources[s][src_ids])
        assert senders[s].stats(tid).num_bytes == 6 * 256 * 4
