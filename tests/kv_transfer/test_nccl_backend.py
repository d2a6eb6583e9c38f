"""What only nccl has: one GPU per rank, refused chunks still received, empty chunks moving nothing. Over gloo on
host pools (the same planes), plus the one-GPU refusal on a real GPU."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from kv_transfer import KVPoolView, TransferState, TransportError, make_receiver, make_sender
from kv_transfer.nccl.gpu_identity import check_distinct_gpus
from kv_transfer.state import ProtocolError
from tests.kv_transfer.gloo_pair_group import GlooNcclReceiver, GlooNcclSender
from tests.kv_transfer.pools import BLOCK_SIZE

PoolMaker = Callable[..., torch.Tensor]
S = TransferState
ONE_GPU = "GPU-4a6f0c2e-0000-0000-0000-000000000001"


@pytest.fixture
def dst(make_pool: PoolMaker) -> torch.Tensor:
    return make_pool(8, seed=2)


@pytest.fixture
def pair(dst: torch.Tensor, make_pool: PoolMaker) -> Iterator[tuple[GlooNcclSender, GlooNcclReceiver]]:
    with GlooNcclReceiver(dst, BLOCK_SIZE) as receiver, GlooNcclSender(make_pool(8, seed=1), BLOCK_SIZE) as sender:
        yield sender, receiver


def test_ranks_on_one_gpu_are_refused_by_name() -> None:
    check_distinct_gpus(None, None)
    check_distinct_gpus("GPU-a", "GPU-b")
    check_distinct_gpus(None, ONE_GPU)
    with pytest.raises(TransportError, match="nccl cannot connect two ranks on one GPU") as raised:
        check_distinct_gpus(ONE_GPU, ONE_GPU)
    assert ONE_GPU in str(raised.value) and "cuda_ipc" in str(raised.value)
    with pytest.raises(ProtocolError):
        check_distinct_gpus(7, ONE_GPU)


def test_a_refused_chunk_is_still_received_so_the_next_one_lands(
    pair: tuple[GlooNcclSender, GlooNcclReceiver], dst: torch.Tensor, make_pool: PoolMaker
) -> None:
    sender, receiver = pair
    receiver.expect("gone", [1], lease_s=5.0)
    receiver.abort("gone")
    receiver.expect("next", [2, 3], lease_s=5.0)
    before = dst.clone()

    sender.send("gone", receiver.endpoint, receiver.layout, [0], [1], last=True)
    sender.send("next", receiver.endpoint, receiver.layout, [4, 5], [2, 3], last=True)

    assert sender.wait("gone", 5.0) is S.ABORTED
    assert sender.wait("next", 5.0) is S.DONE
    assert torch.equal(dst[[2, 3]], make_pool(8, seed=1)[[4, 5]])
    assert torch.equal(dst[[0, 1, 4, 5, 6, 7]], before[[0, 1, 4, 5, 6, 7]])


def test_empty_chunks_move_no_bytes(pair: tuple[GlooNcclSender, GlooNcclReceiver], dst: torch.Tensor) -> None:
    sender, receiver = pair
    receiver.expect("t1", [6], lease_s=5.0)

    sender.send("t1", receiver.endpoint, receiver.layout, [], [], last=False)
    sender.send("t1", receiver.endpoint, receiver.layout, [], [], last=False)
    sender.send("t1", receiver.endpoint, receiver.layout, [7], [6], last=True)

    assert sender.wait("t1", 5.0) is S.DONE
    stats = sender.stats("t1")
    assert (stats.num_chunks, stats.num_blocks, stats.num_bytes) == (3, 1, 256 * 4)


def test_a_sender_on_the_receivers_gpu_fails_before_any_byte(
    monkeypatch: pytest.MonkeyPatch, make_pool: PoolMaker
) -> None:
    for side in ("sender", "receiver"):
        monkeypatch.setattr(f"kv_transfer.nccl.{side}.device_uuid", lambda device: ONE_GPU)
    dst = make_pool(8, seed=2)
    before = dst.clone()
    with GlooNcclReceiver(dst, BLOCK_SIZE) as receiver, GlooNcclSender(make_pool(8, seed=1), BLOCK_SIZE) as sender:
        receiver.expect("t1", [1], lease_s=5.0)
        sender.send("t1", receiver.endpoint, receiver.layout, [0], [1], last=True)

        assert sender.wait("t1", 5.0) is S.FAILED
        error = sender.stats("t1").error
        assert isinstance(error, TransportError) and "two ranks on one GPU" in str(error)
        assert receiver.state("t1") is S.RESERVED
        assert torch.equal(dst, before)


@pytest.mark.gpu
def test_two_ranks_on_one_real_gpu_are_refused(make_pool: PoolMaker) -> None:
    dst = make_pool(8, seed=2).cuda()
    with (
        make_receiver("nccl", KVPoolView(dst, BLOCK_SIZE)) as receiver,
        make_sender("nccl", KVPoolView(dst.clone(), BLOCK_SIZE)) as sender,
    ):
        receiver.expect("t1", [1], lease_s=5.0)
        sender.send("t1", receiver.endpoint, receiver.layout, [0], [1], last=True)

        assert sender.wait("t1", 10.0) is S.FAILED
        assert "two ranks on one GPU" in str(sender.stats("t1").error)
