"""Driving an EngineCore in the test's thread, as its process's loop would, and a KV sender that records chunks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import torch

from engine.core.engine_core import EngineCore
from engine.core.outputs import CoreOutputs
from kv_transfer.base import KVSender, TransferStats, ignore_hook
from kv_transfer.layout import KVLayout
from kv_transfer.state import TransferState, UnknownTransferError

Send = tuple[str, list[int], list[int], bool]


def drive(core: EngineCore, until: Callable[[list[CoreOutputs]], bool], timeout_s: float = 60.0) -> list[CoreOutputs]:
    """Take turns (sleeping a millisecond when a turn had nothing to step) until `until(outputs so far)`."""
    outputs: list[CoreOutputs] = []
    deadline = time.monotonic() + timeout_s
    while not until(outputs):
        assert time.monotonic() < deadline, f"not there after {timeout_s} s: {outputs[-3:]}"
        stepped = core.engine.has_unfinished_requests()
        outputs.append(core.turn())
        if not stepped:
            time.sleep(0.001)
    return outputs


def tokens_of(outputs: Sequence[CoreOutputs], req_id: str) -> list[int]:
    return [t for out in outputs for o in out.outputs if o.req_id == req_id for t in o.new_token_ids]


def finish_of(outputs: Sequence[CoreOutputs], req_id: str) -> str | None:
    reasons = [o.finish_reason for out in outputs for o in out.outputs if o.req_id == req_id and o.finish_reason]
    return reasons[0] if reasons else None


class RecordingSender(KVSender):
    """Records every chunk and abort; a last chunk is acknowledged at once (DONE, from another thread)."""

    def __init__(self, pool: torch.Tensor, block_size: int) -> None:
        self.layout = KVLayout.from_pool(pool, block_size)
        self.on_finished = ignore_hook
        self.sends: list[Send] = []
        self.aborts: list[tuple[str, str | None]] = []

    def send(
        self,
        transfer_id: str,
        endpoint: str,
        layout: KVLayout,
        src_block_ids: Sequence[int],
        dst_block_ids: Sequence[int],
        last: bool,
    ) -> None:
        self.sends.append((transfer_id, list(src_block_ids), list(dst_block_ids), last))
        if last:
            threading.Thread(target=self.on_finished, args=(transfer_id, TransferState.DONE)).start()

    def state(self, transfer_id: str) -> TransferState:
        raise UnknownTransferError(transfer_id)

    def wait(self, transfer_id: str, timeout_s: float) -> TransferState:
        return TransferState.DONE

    def abort(self, transfer_id: str, endpoint: str | None = None) -> None:
        self.aborts.append((transfer_id, endpoint))

    def stats(self, transfer_id: str) -> TransferStats:
        num_blocks = sum(len(src) for tid, src, _, _ in self.sends if tid == transfer_id)
        return TransferStats(transfer_id, TransferState.DONE, num_blocks * self.layout.block_nbytes, num_blocks, 0, 0.0)

    def close(self) -> None:
        pass
