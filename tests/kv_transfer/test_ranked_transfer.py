"""KV transfer between parallel pods, rank to rank under one transfer id (`kv_transfer.ranked`), on every backend
(`backend` fixture), and the refusal of pods of other TP/PP sizes."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest
import torch

from common.errors import InvalidArgumentError
from kv_transfer import (
    KVLayout,
    KVPoolView,
    LayoutMismatchError,
    TransferAbortedError,
    TransferState,
    TransferStateError,
)
from kv_transfer.factory import make_pod_receiver, make_pod_sender
from kv_transfer.layout import KVRank, check_transfer_layouts
from kv_transfer.ranked import RankedReceiver, RankedSender
from tests.kv_transfer.pools import BLOCK_SIZE, random_pool

if TYPE_CHECKING:
    from collections.abc import Callable

    from conftest import Backend, HookRecorder

S = TransferState
WAIT_S = 10.0
TP2 = [KVRank(0, 2), KVRank(1, 2)]


def _pair(
    backend: Backend,
    src: list[torch.Tensor],
    dst: list[torch.Tensor],
    ranks: list[KVRank],
    finished: HookRecorder,
    released: HookRecorder,
) -> tuple[RankedSender, RankedReceiver]:
    receivers = [backend.receiver(pool, rank=rank) for pool, rank in zip(dst, ranks, strict=True)]
    senders = [backend.sender(pool, rank=rank) for pool, rank in zip(src, ranks, strict=True)]
    return RankedSender(senders, finished), RankedReceiver(receivers, released)


def test_tp2_each_rank_lands_in_the_same_rank_under_one_transfer_id(
    backend: Backend, make_pool: Callable[..., torch.Tensor], finished: HookRecorder, released: HookRecorder
) -> None:
    src, dst = [make_pool(6, seed=1), make_pool(6, seed=2)], [make_pool(8, seed=3), make_pool(8, seed=4)]
    before = [pool.clone() for pool in dst]
    sender, receiver = _pair(backend, src, dst, TP2, finished, released)
    assert receiver.layout.rank == KVRank(0, 2) and len(receiver.endpoint.split(",")) == 2
    receiver.expect("t", [5, 1, 3], lease_s=5.0)
    assert receiver.state("t") is S.RESERVED

    sender.send("t", receiver.endpoint, receiver.layout, [0, 4], [5, 1], last=False)
    sender.send("t", receiver.endpoint, receiver.layout, [2], [3], last=True)

    assert sender.wait("t", WAIT_S) is S.DONE and receiver.wait("t", WAIT_S) is S.DONE
    for rank in (0, 1):
        assert torch.equal(dst[rank][[5, 1, 3]], src[rank][[0, 4, 2]])
        assert torch.equal(dst[rank][[0, 2, 4, 6, 7]], before[rank][[0, 2, 4, 6, 7]])
    receiver.claim("t")
    assert finished.wait_for(1) == [("t", S.DONE)]
    stats = sender.stats("t")
    assert (stats.num_bytes, stats.num_blocks, stats.num_chunks) == (2 * 3 * 256 * 4, 3, 2)
    assert released.calls == []


def test_pp2_stages_of_other_layer_counts_ship_stage_to_stage(finished: HookRecorder, released: HookRecorder) -> None:
    """3 layers over 2 stages: stage 0 holds 2 layers, stage 1 one (each pool [blocks, layers, ...])."""
    stage_pools = [(random_pool(4, seed=s), random_pool(4, seed=s + 1)[:, :1].contiguous()) for s in (1, 3)]
    (src0, src1), (dst0, dst1) = stage_pools
    ranks = [KVRank(0, 1, 0, 2), KVRank(0, 1, 1, 2)]
    sender = make_pod_sender(
        "in_process", [KVPoolView(src0, BLOCK_SIZE, ranks[0]), KVPoolView(src1, BLOCK_SIZE, ranks[1])]
    )
    receiver = make_pod_receiver(
        "in_process", [KVPoolView(dst0, BLOCK_SIZE, ranks[0]), KVPoolView(dst1, BLOCK_SIZE, ranks[1])]
    )
    sender.on_finished, receiver.on_released = finished, released
    try:
        receiver.expect("t", [2, 0], lease_s=5.0)
        sender.send("t", receiver.endpoint, receiver.layout, [1, 3], [2, 0], last=True)
        assert receiver.wait("t", WAIT_S) is S.DONE
        assert torch.equal(dst0[[2, 0]], src0[[1, 3]]) and torch.equal(dst1[[2, 0]], src1[[1, 3]])
        receiver.claim("t")
        assert finished.wait_for(1) == [("t", S.DONE)]
    finally:
        sender.close()
        receiver.close()


def test_other_parallel_sizes_are_refused_naming_both() -> None:
    prefill = KVLayout("float32", 16, 2, 1, 8, tp_size=2)
    with pytest.raises(
        LayoutMismatchError, match="tensor_parallel_size 2 on the prefill pod differs from 1 on the decode pod"
    ) as caught:
        check_transfer_layouts(prefill, KVLayout("float32", 16, 2, 2, 8))
    assert caught.value.fields == ("tp_size",)
    with pytest.raises(LayoutMismatchError, match="pipeline_parallel_size 1 on the prefill pod differs from 2"):
        check_transfer_layouts(KVLayout("float32", 16, 2, 2, 8), KVLayout("float32", 16, 1, 2, 8, pp_size=2))
    with pytest.raises(LayoutMismatchError, match="tp_rank: 1 vs 0"):
        check_transfer_layouts(
            KVLayout("float32", 16, 2, 1, 8, 1.0, 1.0, 1, 2), KVLayout("float32", 16, 2, 1, 8, 1.0, 1.0, 0, 2)
        )
    with pytest.raises(InvalidArgumentError, match="tp_rank"):
        KVLayout("float32", 16, 2, 1, 8, tp_rank=2, tp_size=2)
    assert KVLayout.from_dict(prefill.to_dict()) == prefill
    older_peer = {k: v for k, v in prefill.to_dict().items() if k not in ("tp_rank", "tp_size", "pp_rank", "pp_size")}
    assert KVLayout.from_dict(older_peer).rank == KVRank()


def test_a_tp2_sender_meets_a_tp1_receiver_the_transfer_fails_with_the_sizes(
    backend: Backend, make_pool: Callable[..., torch.Tensor], finished: HookRecorder
) -> None:
    receiver = backend.receiver(make_pool(4, seed=1))
    sender = RankedSender([backend.sender(make_pool(4, seed=2), rank=rank) for rank in TP2], finished)
    receiver.expect("t", [0], lease_s=5.0)
    with pytest.raises(InvalidArgumentError, match="names 1 rank receivers, this pod has 2 ranks"):
        sender.send("t", receiver.endpoint, receiver.layout, [1], [0], last=True)
    # TP=2 x PP=1 to TP=1 x PP=2: as many ranks, other sizes: every rank's transfer fails, the transfer once.
    pp2 = [backend.receiver(make_pool(4, seed=1), rank=KVRank(0, 1, stage, 2)) for stage in (0, 1)]
    pp2_receiver = RankedReceiver(pp2)
    pp2_receiver.expect("p", [0], lease_s=5.0)
    sender.send("p", pp2_receiver.endpoint, pp2_receiver.layout, [1], [0], last=True)
    assert sender.wait("p", WAIT_S) is S.FAILED and finished.wait_for(1) == [("p", S.FAILED)]
    assert "tensor_parallel_size 2 on the prefill pod differs from 1 on the decode pod" in str(sender.stats("p").error)
    one_rank = backend.sender(make_pool(4, seed=2), rank=TP2[0], on_finished=finished)
    one_rank.send("t", receiver.endpoint, receiver.layout, [1], [0], last=True)
    assert one_rank.wait("t", WAIT_S) is S.FAILED
    assert "tensor_parallel_size 2 on the prefill pod differs from 1 on the decode pod" in str(
        one_rank.stats("t").error
    )


def test_one_failed_rank_ends_the_whole_transfer_once_after_every_rank(
    backend: Backend, make_pool: Callable[..., torch.Tensor], finished: HookRecorder, released: HookRecorder
) -> None:
    src, dst = [make_pool(6, seed=1), make_pool(6, seed=2)], [make_pool(6, seed=3), make_pool(6, seed=4)]
    sender, receiver = _pair(backend, src, dst, TP2, finished, released)
    ranks = receiver._receivers
    receiver.expect("t", [1, 2], lease_s=5.0)
    sender.send("t", receiver.endpoint, receiver.layout, [0], [1], last=False)
    deadline = time.monotonic() + WAIT_S
    while receiver.state("t") is not S.TRANSFERRING and time.monotonic() < deadline:
        time.sleep(0.005)

    ranks[1].abort("t")

    assert released.wait_for(1) == [("t", S.ABORTED)]
    assert ranks[0].state("t") is S.ABORTED and receiver.state("t") is S.ABORTED
    sender.send("t", receiver.endpoint, receiver.layout, [3], [2], last=True)
    assert finished.wait_for(1)[0][1] in (S.ABORTED, S.FAILED) and len(finished.calls) == 1
    assert sender.state("t") is finished.calls[0][1]
    with pytest.raises(TransferAbortedError):
        receiver.claim("t")
    assert len(released.calls) == 1


def test_pod_ends_refuse_views_out_of_rank_order() -> None:
    views = [KVPoolView(random_pool(2), BLOCK_SIZE, rank) for rank in reversed(TP2)]
    with pytest.raises(InvalidArgumentError, match=r"rank order, got world ranks \[1, 0\]"):
        make_pod_sender("in_process", views)


def test_a_repeated_reservation_is_refused_and_an_ended_id_can_be_reserved_again(released: HookRecorder) -> None:
    pools = [random_pool(4, seed=rank) for rank in (0, 1)]
    receiver = make_pod_receiver("in_process", [KVPoolView(p, BLOCK_SIZE, r) for p, r in zip(pools, TP2, strict=True)])
    receiver.on_released = released
    try:
        receiver.expect("t", [0, 1], lease_s=5.0)
        with pytest.raises(TransferStateError, match="already reserved"):
            receiver.expect("t", [2], lease_s=5.0)
        assert receiver.state("t") is S.RESERVED
        receiver.abort("t")
        assert released.wait_for(1) == [("t", S.ABORTED)]
        receiver.expect("t", [2], lease_s=5.0)
        assert receiver.state("t") is S.RESERVED
        receiver.abort("t")
        assert released.wait_for(2) == [("t", S.ABORTED), ("t", S.ABORTED)]
    finally:
        receiver.close()


def test_a_claim_with_one_rank_ended_raises_and_releases_the_blocks_once(
    finished: HookRecorder, released: HookRecorder
) -> None:
    views = [KVPoolView(random_pool(4, seed=seed), BLOCK_SIZE, rank) for seed, rank in enumerate(TP2)]
    receiver = make_pod_receiver("in_process", views)
    sender = make_pod_sender("in_process", [KVPoolView(random_pool(4), BLOCK_SIZE, rank) for rank in TP2])
    receiver.on_released, sender.on_finished = released, finished
    try:
        receiver.expect("t", [0, 1], lease_s=5.0)
        sender.send("t", receiver.endpoint, receiver.layout, [2, 3], [0, 1], last=True)
        assert receiver.wait("t", WAIT_S) is S.DONE
        receiver._receivers[1].abort("t")  # rank 1's reservation ends before the claim (as by a lapsed lease)
        with pytest.raises(TransferAbortedError):
            receiver.claim("t")
        assert released.wait_for(1) == [("t", S.ABORTED)]
        assert finished.wait_for(1) == [("t", S.DONE)]
        time.sleep(0.1)
        assert len(released.calls) == 1
    finally:
        sender.close()
        receiver.close()
