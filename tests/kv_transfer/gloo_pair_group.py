"""The nccl backend over gloo: its whole protocol on host pools, where no GPU is."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from kv_transfer.control.frames import KeepWaiting
from kv_transfer.nccl import NcclReceiver, NcclSender, PairGroup


class GlooPairGroup(PairGroup):
    def __init__(self, store: dist.Store, rank: int) -> None:
        self._group = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=10))
        self._peer = 1 - rank
        self._sends: list[dist.Work] = []  # gloo sends progress only while their work is alive

    def send(self, tensor: torch.Tensor) -> None:
        self._sends.append(self._group.send([tensor], self._peer, 0))

    def recv(self, tensor: torch.Tensor, keep_waiting: KeepWaiting) -> None:
        self._group.recv([tensor], self._peer, 0).wait()

    def close(self) -> None:
        self._group.abort()
        self._sends.clear()


class GlooNcclSender(NcclSender):
    pair_group = GlooPairGroup


class GlooNcclReceiver(NcclReceiver):
    pair_group = GlooPairGroup
