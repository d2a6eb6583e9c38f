"""2 and 4 GPUs (NCCL + peer memory): the peer-memory all-reduce equals NCCL's sum within bf16 rounding, one-shot
and two-shot, eagerly and replayed from a CUDA graph with new inputs; messages it does not take go to NCCL (the
checks: peer_all_reduce_ranks.py)."""

from __future__ import annotations

import tempfile

import pytest
import torch
import torch.multiprocessing as mp

from tests.engine.parallel.peer_all_reduce_ranks import run_rank

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("world_size", [2, 4])
def test_peer_all_reduce_matches_nccl(world_size: int) -> None:
    if torch.cuda.device_count() < world_size:
        pytest.skip(f"needs {world_size} GPUs")
    with tempfile.TemporaryDirectory(prefix="pdserve-peer-ar-") as folder:
        mp.spawn(run_rank, (world_size, f"{folder}/store"), nprocs=world_size)
