"""Micro-benchmark of the TP all-reduce paths on one host's GPUs: NCCL against the peer-memory one-shot and two-shot
kernels (`engine.parallel.peer_all_reduce`), bf16, from one decode row of a 4096-wide model (8 KB) to a 4096-token
prefill chunk (32 MB).

One process per GPU. Per size and path: us per call (median of CUDA-graph replays, 20 calls per graph, as decode
graphs hold them) and the bus bandwidth (2 (n - 1) / n x bytes / time, NCCL's convention); and, on fresh random
inputs, the largest difference from NCCL's sum (0 expected on 2 GPUs: each element is one bf16 rounding of the same
two-term sum).
Usage: python3 -m bench.kernels.all_reduce [--world-size 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.parallel.peer_all_reduce import PeerAllReduce
from engine.tuning.timing import time_graph_ms

SIZES = tuple(1 << k for k in range(13, 26))  # 8 KB .. 32 MB
CALLS_PER_GRAPH = 20
DTYPE = torch.bfloat16


def _paths(peer: PeerAllReduce) -> dict[str, Callable[[torch.Tensor], object]]:
    return {"nccl": dist.all_reduce, "one_shot": peer.one_shot, "two_shot": peer.two_shot}


def _max_diff_from_nccl(reduce: Callable[[torch.Tensor], object], nbytes: int, rank: int) -> float:
    torch.manual_seed(1000 + rank)
    x = torch.randn(nbytes // DTYPE.itemsize, dtype=DTYPE, device="cuda")
    expected = x.clone()
    dist.all_reduce(expected)
    reduce(x)
    return (x.float() - expected.float()).abs().max().item()


def _measure(rank: int, world_size: int) -> list[dict[str, object]]:
    device = torch.device("cuda", rank)
    group = dist.new_group(list(range(world_size)))
    peer = PeerAllReduce.create(group, device, [torch.device("cuda", r) for r in range(world_size)], SIZES[-1])
    assert peer is not None, "peer memory is not usable here"
    rows: list[dict[str, object]] = []
    for nbytes in SIZES:
        for name, reduce in _paths(peer).items():
            tensors = [torch.randn(nbytes // DTYPE.itemsize, dtype=DTYPE, device=device) for _ in range(4)]
            calls = [functools.partial(reduce, tensors[i % 4]) for i in range(CALLS_PER_GRAPH)]
            dist.barrier()
            us = 1e3 * time_graph_ms(calls)
            diff = _max_diff_from_nccl(reduce, nbytes, rank)
            bus_gbs = 2 * (world_size - 1) / world_size * nbytes / us / 1e3
            rows.append({"bytes": nbytes, "path": name, "us": us, "bus_gb_s": bus_gbs, "max_diff_vs_nccl": diff})
    return rows


def _worker(rank: int, world_size: int, store: str, out: str | None) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world_size)
    try:
        rows = _measure(rank, world_size)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return
    print(f"{'bytes':>10} {'path':>9} {'us':>8} {'bus GB/s':>9} {'max diff':>9}")
    for row in rows:
        print(
            f"{row['bytes']:>10} {row['path']:>9} {row['us']:>8.2f} {row['bus_gb_s']:>9.1f} "
            f"{row['max_diff_vs_nccl']:>9.3g}"
        )
    if out is not None:
        Path(out, "all_reduce.json").write_text(json.dumps({"world_size": world_size, "rows": rows}, indent=1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--out", default=None, help="folder for all_reduce.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pdserve-allreduce-") as folder:
        mp.spawn(_worker, (args.world_size, f"{folder}/store", args.out), nprocs=args.world_size)


if __name__ == "__main__":
    main()
