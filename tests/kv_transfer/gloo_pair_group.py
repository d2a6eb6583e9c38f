"""The nccl backend over gloo: its whole protocol on host pools, where no GPU is."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from kv_transfer.control.frames import KeepWaiting
from kv_transfer.nccl import NcclReceiver, NcclSender, PairGroup
from kv_transfer.nccl.pair_group import Receiving, Sending


class _GlooSending(Sending):
    def __init__(self, work: dist.Work) -> None:
        self._work = work

    def wait_sent(self) -> None:
        self._work.wait()


class _GlooReceiving(Receiving):
    def __init__(self, work: dist.Work) -> None:
        self._work = work

    def wait(self, keep_waiting: KeepWaiting) -> None:
        self._work.wait()


class GlooPairGroup(PairGroup):
    def __init__(self, store: dist.Store, rank: int) -> None:
        self._group = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=10))
        self._peer = 1 - rank
        self._sends: list[dist.Work] = []  # gloo sends progress only while their work is alive

    def send(self, tensor: torch.Tensor) -> Sending:
        self._sends.append(self._group.send([tensor], self._peer, 0))
        return _GlooSending(self._sends[-1])

    def recv(self, tensor: torch.Tensor) -> Receiving:
        return _GlooReceiving(self._group.recv([tensor], self._peer, 0))

    def close(self) -> None:
        self._group.abort()
        self._sends.clear()


class GlooNcclSender(NcclSender):
    """Pieces of 2 blocks of the test pools (1 KiB each), so that chunks of several blocks go as several sends."""

    pair_group = GlooPairGroup
    piece_nbytes = 2 * 1024


class GlooNcclReceiver(NcclReceiver):
    pair_group = GlooPairGroup
