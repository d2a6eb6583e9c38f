"""What only nccl has: one GPU per rank, chunks sent in pieces, refused chunks still received, empty chunks moving
nothing. Over gloo on host pools (the same planes; pieces of 2 blocks), plus the one-GPU refusal on a real GPU."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from common.errors import InvalidArgumentError
from kv_transfer import KVPoolView, TransferState, TransportError, make_receiver, make_sender
from kv_transfer.control.address import parse_endpoint
from kv_transfer.control.frames import FrameType, Hello, read_error, read_head
from kv_transfer.nccl import NcclReceiver, NcclSender
from kv_transfer.nccl.gpu_identity import check_distinct_gpus
from kv_transfer.nccl.pieces import piece_blocks, piece_bounds
from kv_transfer.state import ProtocolError
from tests.kv_transfer.backends import needs_two_gpus
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


def test_a_chunk_is_cut_into_pieces_of_whole_blocks() -> None:
    assert piece_blocks(32 << 20, 2_359_296) == 14  # Qwen3-8B's 2.36 MB blocks in ~32 MB sends
    assert piece_blocks(1000, 4096) == 1
    assert piece_bounds(5, 2) == [(0, 2), (2, 4), (4, 5)]
    assert piece_bounds(4, 2) == [(0, 2), (2, 4)]
    assert piece_bounds(0, 2) == []
    with pytest.raises(InvalidArgumentError):
        piece_blocks(0, 4096)


def test_chunks_of_several_pieces_land_bit_exact_through_the_staging_ring(
    pair: tuple[GlooNcclSender, GlooNcclReceiver], dst: torch.Tensor, make_pool: PoolMaker
) -> None:
    sender, receiver = pair
    src = make_pool(8, seed=1)
    # 5 + 2 pieces of at most 2 blocks per transfer, more than the sender's ring of 4 staging pieces holds
    for transfer_id, src_ids in (("t1", [6, 1, 4, 0, 7, 2, 3, 5]), ("t2", [0, 1, 2, 3, 4, 5, 6, 7])):
        dst_ids = [3, 7, 0, 5, 2, 1, 4, 6]
        receiver.expect(transfer_id, dst_ids, lease_s=5.0)

        chunks = [(src_ids[:5], dst_ids[:5]), (src_ids[5:], dst_ids[5:])]
        for i, (src_chunk, dst_chunk) in enumerate(chunks):
            sender.send(transfer_id, receiver.endpoint, receiver.layout, src_chunk, dst_chunk, last=i == 1)

        assert sender.wait(transfer_id, 5.0) is S.DONE
        receiver.claim(transfer_id)
        want = torch.empty_like(src)
        want[dst_ids] = src[src_ids]
        assert torch.equal(dst, want)


@pytest.mark.parametrize("field", [None, 0, "2", True])
def test_a_hello_without_a_piece_size_is_refused(pair: tuple[GlooNcclSender, GlooNcclReceiver], field: Any) -> None:
    _, receiver = pair
    plane = {"device": None} if field is None else {"device": None, "piece_blocks": field}
    with socket.create_connection(parse_endpoint(receiver.endpoint), timeout=2.0) as sock:
        sock.sendall(Hello("nccl", receiver.layout, plane).encode())
        head = read_head(sock, lambda: False)
        assert head.kind is FrameType.ERROR
        assert "blocks per piece" in str(read_error(sock, head, lambda: False))


def test_a_refused_chunk_is_still_received_so_the_next_one_lands(
    pair: tuple[GlooNcclSender, GlooNcclReceiver], dst: torch.Tensor, make_pool: PoolMaker
) -> None:
    sender, receiver = pair
    receiver.expect("gone", [1, 6, 0], lease_s=5.0)
    receiver.abort("gone")
    receiver.expect("next", [2, 3, 7], lease_s=5.0)
    before = dst.clone()

    sender.send("gone", receiver.endpoint, receiver.layout, [0, 3, 2], [1, 6, 0], last=True)  # 2 pieces
    sender.send("next", receiver.endpoint, receiver.layout, [4, 5, 1], [2, 3, 7], last=True)

    assert sender.wait("gone", 5.0) is S.ABORTED
    assert sender.wait("next", 5.0) is S.DONE
    assert torch.equal(dst[[2, 3, 7]], make_pool(8, seed=1)[[4, 5, 1]])
    assert torch.equal(dst[[0, 1, 4, 5, 6]], before[[0, 1, 4, 5, 6]])


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


class _SmallPiecesNcclSender(NcclSender):
    piece_nbytes = 2 * 1024


@pytest.mark.gpu
@needs_two_gpus
def test_pieces_land_bit_exact_across_two_real_gpus(make_pool: PoolMaker) -> None:
    dst = make_pool(8, seed=2).to("cuda:1")
    src_ids, dst_ids = [6, 1, 4, 0, 7], [3, 7, 0, 5, 2]  # pieces of 2, 2 and 1 blocks
    want = dst.cpu()
    want[dst_ids] = make_pool(8, seed=1)[src_ids]
    with (
        NcclReceiver(dst, BLOCK_SIZE) as receiver,
        _SmallPiecesNcclSender(make_pool(8, seed=1).to("cuda:0"), BLOCK_SIZE) as sender,
    ):
        receiver.expect("t1", dst_ids, lease_s=30.0)
        sender.send("t1", receiver.endpoint, receiver.layout, src_ids, dst_ids, last=True)

        assert sender.wait("t1", 30.0) is S.DONE
        assert torch.equal(dst.cpu(), want)
