"""The ranks of tests/engine/parallel/test_peer_all_reduce_gpu.py (a module of its own, so that the processes the test
spawns import it by name): each checks the peer-memory all-reduce against NCCL's sum on its GPU."""

from __future__ import annotations

import torch
import torch.distributed as dist

from engine.parallel.communicator import Communicator
from engine.parallel.peer_all_reduce import PeerAllReduce
from engine.parallel.rank import ParallelRank

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


def _inputs(shape: tuple[int, ...], dtype: torch.dtype, seed: int, world_size: int) -> list[torch.Tensor]:
    """Every rank's input for one check, drawn on the CPU so each rank knows the others'."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator).to(dtype) for _ in range(world_size)]


def _rounding_bound(inputs: list[torch.Tensor]) -> torch.Tensor:
    """How far a sum of `inputs` in their dtype may be from the float64 sum: with 2 ranks one rounding of the sum;
    with more, each partial sum may round once more (bf16 adds round at every step, in NCCL and here)."""
    stacked = torch.stack([x.double() for x in inputs])
    unit = 2**-8 if inputs[0].dtype == torch.bfloat16 else 2**-22
    return unit * (stacked.sum(0).abs() + (len(inputs) - 2) * stacked.abs().sum(0)) + 1e-6


def _check(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, label: str) -> None:
    error = (actual.cpu().double() - expected.cpu().double()).abs()
    worst = int((error - bound).argmax())
    assert (error <= bound).all(), f"{label}: error {error.flatten()[worst]:.3g} over {bound.flatten()[worst]:.3g}"


def _check_sum(actual: torch.Tensor, inputs: list[torch.Tensor], label: str) -> None:
    """Within rounding of the float64 sum of every rank's input."""
    _check(actual, torch.stack([x.double() for x in inputs]).sum(0), _rounding_bound(inputs), label)


def _eager_cases(comm: Communicator, rank: int) -> None:
    device = torch.device("cuda", rank)
    for seed, (shape, dtype) in enumerate(CASES):
        inputs = _inputs(shape, dtype, seed, comm.rank.tp_size)
        nccl = inputs[rank].to(device)
        dist.all_reduce(nccl, group=comm.tp_group)
        x = inputs[rank].to(device)
        assert comm.all_reduce(x) is x
        _check_sum(x, inputs, f"{shape} {dtype}")
        _check_sum(nccl, inputs, f"{shape} {dtype} NCCL")
        # NOTE: each within rounding of the exact sum, so within twice that of each other (equal with 2 ranks)
        _check(x, nccl, 2 * _rounding_bound(inputs), f"{shape} {dtype} against NCCL")


def _graph_cases(peer: PeerAllReduce, rank: int, world_size: int) -> None:
    device = torch.device("cuda", rank)
    for shape in ((1, 4096), (64, 4096)):  # one-shot, two-shot
        static = torch.zeros(shape, dtype=torch.bfloat16, device=device)
        peer(static)  # warm-up outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            peer(static)
        for replay in range(3):
            inputs = _inputs(shape, torch.bfloat16, 100 + replay, world_size)
            static.copy_(inputs[rank].to(device))
            graph.replay()
            _check_sum(static, inputs, f"graph {shape} replay {replay}")


def run_rank(rank: int, world_size: int, store: str) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world_size)
    try:
        group = dist.new_group(list(range(world_size)))
        devices = [torch.device("cuda", r) for r in range(world_size)]
        peer = PeerAllReduce.create(group, devices[rank], devices, MAX_BYTES, ONE_SHOT_MAX)
        assert peer is not None, "the GPUs of one host map each other's memory"
        comm = Communicator(ParallelRank(tp_rank=rank, tp_size=world_size), group, peer)
        _eager_cases(comm, rank)
        _graph_cases(peer, rank, world_size)
        torch.cuda.synchronize()
    finally:
        dist.destroy_process_group()
