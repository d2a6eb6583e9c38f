"""The TP all-reduce choice on the CPU: the `all_reduce` field, and a gloo group that keeps torch.distributed's
all-reduce (peer memory is CUDA only; the 2-GPU cases are in test_peer_all_reduce_gpu.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from common.errors import InvalidArgumentError
from engine.config import ParallelConfig
from engine.parallel.peer_all_reduce import PeerAllReduce


def test_all_reduce_field_names_the_choices() -> None:
    assert ParallelConfig().all_reduce == "auto"
    assert ParallelConfig(2, all_reduce="nccl").all_reduce == "nccl"
    with pytest.raises(InvalidArgumentError, match="must be one of auto, nccl, got 'mpi'") as raised:
        ParallelConfig(2, all_reduce="mpi")
    assert raised.value.field == "all_reduce"


def test_a_cpu_group_gets_no_peer_all_reduce(tmp_path: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        group = dist.new_group([0])
        cpu = torch.device("cpu")
        assert PeerAllReduce.create(group, cpu, [cpu]) is None
    finally:
        dist.destroy_process_group()
