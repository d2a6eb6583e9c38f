"""The ranks of tests/engine/parallel/test_peer_all_reduce_gpu.py (a module of its own, so that the processes the test
spawns import it by name): each checks the peer-memory all-reduce against NCCL's sum on its GPU."""

from __future__ import annotations

import torch
import torch.distributed as dist

from engine.parallel.communicator import Communicator
from engine.parallel.peer_all_reduce import PeerAllReduce
from engine.parallel.rank import ParallelRank

WORLD_SIZE = 2
ONE_SHOT_MAX = 64 << 10
MAX_BYTES = 1 << 20
# (shape, dtype): one decode row, a few rows, one row of a tiny float32 model, a row of 8,200 bytes (not a multiple
# of 16: NCCL), two-shot sizes (one not a multiple of the ranks' 16-byte parts), and one above MAX_BYTES (NCCL).
CASES = [
    ((1, 4096), torch.bfloat16),
    ((3, 4096), torch.bfloat16),
    ((1, 64), torch.float32),
    ((1, 4100), torch.bfloat16),
    ((64, 4096), torch.bfloat16),
    ((37, 4104), torch.bfloat16),
    ((2, 40960), torch.float32),
    ((256, 4096), torch.bfloat16),
]


def _inputs(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    """Every rank's input for one check, drawn on the CPU so each rank knows the others'."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator).to(dtype) for _ in range(WORLD_SIZE)]


def _check(actual: torch.Tensor, inputs: list[torch.Tensor], label: str) -> None:
    """Equal to NCCL's sum within one rounding to the dtype (the float64 sum rounded once)."""
    exact = torch.stack([x.double() for x in inputs]).sum(0)
    rtol = 2**-8 if actual.dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(actual.cpu().double(), exact, rtol=rtol, atol=1e-6, msg=lambda m: f"{label}: {m}")


def _eager_cases(comm: Communicator, rank: int) -> None:
    device = torch.device("cuda", rank)
    for seed, (shape, dtype) in enumerate(CASES):
        inputs = _inputs(shape, dtype, seed)
        nccl = inputs[rank].to(device)
        dist.all_reduce(nccl, group=comm.tp_group)
        x = inputs[rank].to(device)
        assert comm.all_reduce(x) is x
        _check(x, inputs, f"{shape} {dtype}")
        torch.testing.assert_close(x, nccl, rtol=2**-8 if dtype == torch.bfloat16 else 1e-6, atol=1e-6)


def _graph_cases(peer: PeerAllReduce, rank: int) -> None:
    device = torch.device("cuda", rank)
    for shape in ((1, 4096), (64, 4096)):  # one-shot, two-shot
        static = torch.zeros(shape, dtype=torch.bfloat16, device=device)
        peer(static)  # warm-up outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            peer(static)
        for replay in range(3):
            inputs = _inputs(shape, torch.bfloat16, 100 + replay)
            static.copy_(inputs[rank].to(device))
            graph.replay()
            _check(static, inputs, f"graph {shape} replay {replay}")


def run_rank(rank: int, store: str) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=WORLD_SIZE)
    try:
        group = dist.new_group(list(range(WORLD_SIZE)))
        devices = [torch.device("cuda", r) for r in range(WORLD_SIZE)]
        peer = PeerAllReduce.create(group, devices[rank], devices, MAX_BYTES, ONE_SHOT_MAX)
        assert peer is not None, "two GPUs of one host map each other's memory"
        comm = Communicator(ParallelRank(tp_rank=rank, tp_size=WORLD_SIZE), group, peer)
        _eager_cases(comm, rank)
        _graph_cases(peer, rank)
        torch.cuda.synchronize()
    finally:
        dist.destroy_process_group()
