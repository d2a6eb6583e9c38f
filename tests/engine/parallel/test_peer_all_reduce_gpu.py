"""Two GPUs (NCCL + peer memory): the peer-memory all-reduce equals NCCL's sum within bf16 rounding, one-shot and
two-shot, eagerly and replayed from a CUDA graph with new inputs; messages it does not take go to NCCL (the checks:
peer_all_reduce_ranks.py)."""

from __future__ import annotations

import tempfile

import pytest
import torch
import torch.multiprocessing as mp

from tests.engine.parallel.peer_all_reduce_ranks import WORLD_SIZE, run_rank

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
]


def test_peer_all_reduce_matches_nccl() -> None:
    with tempfile.TemporaryDirectory(prefix="pdserve-peer-ar-") as folder:
        mp.spawn(run_rank, (f"{folder}/store",), nprocs=WORLD_SIZE)
