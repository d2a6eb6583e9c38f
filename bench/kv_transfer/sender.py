"""W6's sender side (`bench.kv_transfer.w6`): a spawned child holding one pool of random bits per rank and the pod's
sender over them, serving transfer and checksum orders; and the pool helpers both sides share.

A TP=N pod pair: rank r's pool holds 1/N of the KV heads, on the sender's device index + r (the receiver's likewise),
and every transfer moves each rank's blocks to the same rank under one transfer id (`kv_transfer.ranked`).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch

from common.child_process import die_with_parent
from kv_transfer import KVLayout, KVPoolView, KVSender, TransferState
from kv_transfer.factory import make_pod_sender
from kv_transfer.pool_io import block_index, pool_words

LEASE_S = 120.0
_CHECKSUM_BATCH_BLOCKS = 64


def rank_layouts(layout: KVLayout, tp_size: int) -> list[KVLayout]:
    """The layout of each rank's pool of a TP=`tp_size` pod whose whole KV is `layout`."""
    if layout.num_kv_heads % tp_size:
        raise ValueError(f"num_kv_heads {layout.num_kv_heads} is not divisible by tensor_parallel_size {tp_size}")
    heads = layout.num_kv_heads // tp_size
    return [dataclasses.replace(layout, num_kv_heads=heads, tp_rank=r, tp_size=tp_size) for r in range(tp_size)]


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank `rank`'s device: the next GPUs after `device`'s (the host for a host device)."""
    return device if device.type != "cuda" else torch.device("cuda", (device.index or 0) + rank)


def empty_pool(layout: KVLayout, num_blocks: int, device: torch.device) -> torch.Tensor:
    shape = (num_blocks, layout.num_layers, 2, layout.block_size, layout.num_kv_heads, layout.head_dim)
    return torch.empty(shape, dtype=getattr(torch, layout.dtype), device=device)


def rank_views(layouts: Sequence[KVLayout], num_blocks: int, device: torch.device) -> list[KVPoolView]:
    """An empty pool per rank, on its rank's device."""
    return [
        KVPoolView(empty_pool(layout, num_blocks, rank_device(device, r)), layout.block_size, layout.rank)
        for r, layout in enumerate(layouts)
    ]


def block_checksums(words: torch.Tensor, block_ids: Sequence[int]) -> list[int]:
    """Per block, the sum of its words times odd weights (1, 3, 5, ...), wrapping mod 2^64: a changed, moved or
    swapped word changes it. The sum does not depend on the order of addition, so host and GPU agree."""
    weights = torch.arange(1, 2 * words.shape[1], 2, dtype=torch.int64, device=words.device)
    sums = []
    for start in range(0, len(block_ids), _CHECKSUM_BATCH_BLOCKS):
        index = block_index(block_ids[start : start + _CHECKSUM_BATCH_BLOCKS], words.device)
        sums.append((words.index_select(0, index).to(torch.int64) * weights).sum(dim=1))
    return [int(value) for value in torch.cat(sums).tolist()]


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def synchronize(devices: Sequence[torch.device]) -> None:
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)


@dataclass(frozen=True, slots=True)
class SenderSetup:
    backend: str
    layouts: list[KVLayout]
    """One per rank."""
    num_blocks: int
    device: str
    """Rank 0's device."""
    seed: int


@dataclass(frozen=True, slots=True)
class Transfer:
    transfer_id: str
    chunks: list[tuple[list[int], list[int]]]
    """(source ids, destination ids) per chunk."""


@dataclass(frozen=True, slots=True)
class TransferOrder:
    """Transfers to run at once, timed together."""

    endpoint: str
    layout: KVLayout
    transfers: list[Transfer]


@dataclass(frozen=True, slots=True)
class ChecksumOrder:
    block_ids: list[int]


@dataclass(frozen=True, slots=True)
class Timing:
    state: TransferState
    seconds: float
    error: str


def _timed_transfers(sender: KVSender, order: TransferOrder, devices: Sequence[torch.device]) -> Timing:
    """Send the order's transfers chunk by chunk in turn (each transfer's first chunk, then each one's second, ...),
    as a prefill pod ships the chunks of the prompts it computes together; timed from the first send to the last
    transfer's end."""
    synchronize(devices)
    start = time.perf_counter()
    for k in range(max(len(transfer.chunks) for transfer in order.transfers)):
        for transfer in order.transfers:
            if k < len(transfer.chunks):
                src_ids, dst_ids = transfer.chunks[k]
                last = k == len(transfer.chunks) - 1
                sender.send(transfer.transfer_id, order.endpoint, order.layout, src_ids, dst_ids, last=last)
    states = [sender.wait(transfer.transfer_id, LEASE_S) for transfer in order.transfers]
    seconds = time.perf_counter() - start
    errors = [str(sender.stats(transfer.transfer_id).error or "") for transfer in order.transfers]
    failed = [(state, error) for state, error in zip(states, errors, strict=True) if state is not TransferState.DONE]
    state, error = failed[0] if failed else (TransferState.DONE, "")
    return Timing(state, seconds, error)


def _sender_main(conn: Connection, setup: SenderSetup, parent_pid: int) -> None:
    """The child: a pool of random bits per rank and the pod's sender over them, serving orders until None; it dies
    with the benchmark's process (`parent_pid`), whose pools go with it."""
    die_with_parent(parent_pid)
    views = rank_views(setup.layouts, setup.num_blocks, torch.device(setup.device))
    devices = [view.pool.device for view in views]
    words = [pool_words(view.pool) for view in views]
    for rank_words in words:
        rank_words.random_(generator=torch.Generator(rank_words.device).manual_seed(setup.seed))
    with make_pod_sender(setup.backend, views, lease_s=LEASE_S) as sender:
        conn.send(device_name(devices[0]))
        while (order := conn.recv()) is not None:
            if isinstance(order, ChecksumOrder):
                conn.send([block_checksums(rank_words, order.block_ids) for rank_words in words])
            else:
                conn.send(_timed_transfers(sender, order, devices))


class SenderProcess:
    """The spawned child and its pipe."""

    def __init__(self, setup: SenderSetup) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(
            target=_sender_main, args=(child_conn, setup, os.getpid()), name="w6-sender", daemon=True
        )
        self._process.start()
        child_conn.close()
        self.device_name: str = self._receive()

    def ask(self, order: TransferOrder | ChecksumOrder) -> Any:
        self._conn.send(order)
        return self._receive()

    def _receive(self) -> Any:
        if not self._conn.poll(LEASE_S * 2):
            raise TimeoutError(f"the W6 sender (pid {self._process.pid}) did not answer")
        try:
            return self._conn.recv()
        except EOFError:
            self._process.join(5.0)
            raise RuntimeError(f"the W6 sender died (exit code {self._process.exitcode})") from None

    def close(self) -> None:
        self._conn.send(None)
        self._process.join(60.0)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
