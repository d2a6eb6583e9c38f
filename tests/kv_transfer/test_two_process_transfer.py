"""Two processes, as the pods run them: the sender in a spawned child, the receiver here. Per backend: bytes checked
bit for bit, the ends (abort, lease lapse) and the layout check of the handshake. tcp runs everywhere; cuda_ipc
needs a GPU (both sides on it: the receiver maps the child's pool) and runs across two as well, nccl needs two (child
on the first)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
import torch

from kv_transfer import KVLayout, KVPoolView, KVReceiver, TransferState, make_receiver
from tests.kv_transfer.backends import needs_two_gpus
from tests.kv_transfer.pools import BLOCK_SIZE, random_pool
from tests.kv_transfer.remote_sender import RemoteSender, SenderSpec

if TYPE_CHECKING:
    from conftest import HookRecorder

S = TransferState
WAIT_S = 30.0  # an upper bound: a first nccl contact builds the pair's communicator
NUM_SRC_BLOCKS = 16
SRC_SEED = 1


@dataclass(frozen=True)
class Pair:
    backend: str
    child: RemoteSender
    receiver_device: torch.device

    def pool(self, num_blocks: int, head_dim: int = 8) -> torch.Tensor:
        return random_pool(num_blocks, seed=2, head_dim=head_dim).to(self.receiver_device)


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(("tcp", "cpu", "cpu"), marks=pytest.mark.slow, id="tcp"),  # the child's start: ~3 s of CPU
        pytest.param(("cuda_ipc", "cuda:0", "cuda:0"), marks=pytest.mark.gpu, id="cuda_ipc"),
        # NOTE: the receiver's copy kernel reads the child's pool on the other GPU over peer access
        pytest.param(("cuda_ipc", "cuda:0", "cuda:1"), marks=[pytest.mark.gpu, needs_two_gpus], id="cuda_ipc_2gpu"),
        pytest.param(("nccl", "cuda:0", "cuda:1"), marks=[pytest.mark.gpu, needs_two_gpus], id="nccl"),
    ],
)
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    backend, sender_device, receiver_device = request.param
    child = RemoteSender(SenderSpec(backend, sender_device, NUM_SRC_BLOCKS, SRC_SEED))
    yield Pair(backend, child, torch.device(receiver_device))
    child.close()


@pytest.fixture
def open_receiver(pair: Pair) -> Iterator[Callable[..., KVReceiver]]:
    opened: list[KVReceiver] = []

    def make(pool: torch.Tensor, **kwargs: Any) -> KVReceiver:
        opened.append(make_receiver(pair.backend, KVPoolView(pool, BLOCK_SIZE), **kwargs))
        return opened[-1]

    yield make
    for receiver in opened:
        receiver.close()


def _eventually(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while not (holds := predicate()) and time.monotonic() < deadline:
        time.sleep(0.005)
    return holds


def test_blocks_arrive_bit_exact(pair: Pair, open_receiver: Callable[..., KVReceiver]) -> None:
    dst = pair.pool(16)
    before = dst.clone()
    receiver = open_receiver(dst)
    receiver.expect("bits", [9, 2, 14, 5, 0, 7], lease_s=WAIT_S)

    pair.child.send("bits", receiver.endpoint, receiver.layout, [3, 0, 11], [9, 2, 14], False)
    pair.child.send("bits", receiver.endpoint, receiver.layout, [15, 8, 4], [5, 0, 7], True)

    assert pair.child.wait("bits", WAIT_S) is S.DONE
    assert receiver.wait("bits", WAIT_S) is S.DONE
    receiver.claim("bits")
    expected = random_pool(NUM_SRC_BLOCKS, seed=SRC_SEED)[[3, 0, 11, 15, 8, 4]]
    assert torch.equal(dst[[9, 2, 14, 5, 0, 7]].cpu().view(torch.uint8), expected.view(torch.uint8))
    untouched = [b for b in range(16) if b not in (9, 2, 14, 5, 0, 7)]
    assert torch.equal(dst[untouched], before[untouched])
    stats = pair.child.stats("bits")
    assert (stats.state, stats.num_bytes, stats.num_blocks, stats.error_type) == (S.DONE, 6 * 256 * 4, 6, None)


def test_abort_in_the_child_releases_the_blocks(
    pair: Pair, open_receiver: Callable[..., KVReceiver], released: HookRecorder
) -> None:
    dst = pair.pool(8)
    receiver = open_receiver(dst, on_released=released)
    receiver.expect("abort", [1, 2], lease_s=WAIT_S)
    pair.child.send("abort", receiver.endpoint, receiver.layout, [0], [1], False)
    assert _eventually(lambda: pair.child.stats("abort").num_blocks == 1)

    pair.child.abort("abort")

    assert receiver.wait("abort", WAIT_S) is S.ABORTED
    assert released.wait_for(1, WAIT_S) == [("abort", S.ABORTED)]
    assert pair.child.state("abort") is S.ABORTED
    before = dst.clone()
    pair.child.send("abort", receiver.endpoint, receiver.layout, [1], [2], True)  # dropped: the transfer ended
    assert pair.child.stats("abort").num_chunks == 1
    assert torch.equal(dst, before)


def test_lapsed_lease_refuses_the_childs_chunk(
    pair: Pair, open_receiver: Callable[..., KVReceiver], released: HookRecorder
) -> None:
    dst = pair.pool(8)
    before = dst.clone()
    receiver = open_receiver(dst, on_released=released)
    receiver.expect("late", [3], lease_s=0.2)
    assert released.wait_for(1, WAIT_S) == [("late", S.EXPIRED)]

    pair.child.send("late", receiver.endpoint, receiver.layout, [5], [3], True)

    assert pair.child.wait("late", WAIT_S) is S.EXPIRED
    stats = pair.child.stats("late")
    assert (stats.error_type, stats.num_bytes) == ("TransferExpiredError", 0)
    assert torch.equal(dst, before)


def test_layout_mismatch_fails_in_the_handshake(pair: Pair, open_receiver: Callable[..., KVReceiver]) -> None:
    dst = pair.pool(8, head_dim=16)
    before = dst.clone()
    receiver = open_receiver(dst)
    receiver.expect("layout", [3], lease_s=WAIT_S)
    child_layout = KVLayout.from_pool(random_pool(1), BLOCK_SIZE)

    # The announced layout is (wrongly) the child's own, so only the handshake can catch the mismatch.
    pair.child.send("layout", receiver.endpoint, child_layout, [0], [3], True)

    assert pair.child.wait("layout", WAIT_S) is S.FAILED
    stats = pair.child.stats("layout")
    assert (stats.error_type, stats.error_fields) == ("LayoutMismatchError", ("head_dim",))
    assert receiver.state("layout") is S.RESERVED
    assert torch.equal(dst, before)
