"""One worker process of a parallel engine: its device, its process groups, its `ModelRunner` shard.

Lifecycle: tie this process's life to the engine's process (`common.child_process`) -> join the process group
(NCCL on CUDA, gloo on CPU; a file store in the engine's temp folder) -> build the runner (loading only this rank's
slices) -> report `WorkerReady` (with the KV pool, shared with the engine's process) -> run each pickled
`SchedulerOutput` the engine sends, the output rank (TP rank 0 of the last stage) answering with the `RunnerOutput`
-> stop on an empty message or when the engine's end of the pipe closes. Any exception is reported as
`WorkerFailed` before the process exits non-zero.
"""

from __future__ import annotations

import logging
import pickle
import traceback
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from common.child_process import die_with_parent
from engine.config import EngineConfig, ParallelConfig
from engine.model_runner import ModelRunner, resolve_device
from engine.parallel.communicator import Communicator
from engine.parallel.peer_all_reduce import PeerAllReduce
from engine.parallel.rank import ParallelRank
from engine.pending_output import PendingOutput
from kv_transfer.cuda_ipc.pool_handle import PoolHandle
from kv_transfer.pool_io import pool_bytes

logger = logging.getLogger(__name__)

COLLECTIVE_TIMEOUT = timedelta(minutes=10)
"""How long a collective waits for a peer: a worker whose peer died exits after this at the latest (the engine
sees the death at once through the process sentinel and stops the others)."""
_POLL_S = 50e-6
"""While a step runs and no message waits, the output rank looks this often for the step's end."""


@dataclass(slots=True, frozen=True)
class WorkerReady:
    num_blocks: int
    max_model_len: int
    device: str
    dtype: torch.dtype
    kv_pool: torch.Tensor
    kv_pool_handle: dict[str, Any] | None
    """The pool's CUDA IPC handle exported here (None on the CPU): the engine's process maps the pool and cannot
    export it again, and the cuda_ipc KV sender needs it."""


@dataclass(slots=True, frozen=True)
class WorkerFailed:
    world_rank: int
    error: str


def output_rank(tp_size: int, pp_size: int) -> int:
    """The world rank that returns the sampled tokens: TP rank 0 of the last stage."""
    return (pp_size - 1) * tp_size


def _join(rank: ParallelRank, device: torch.device, store: Path, parallel: ParallelConfig) -> Communicator:
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        init_method=f"file://{store}",
        rank=rank.world_rank,
        world_size=rank.world_size,
        timeout=COLLECTIVE_TIMEOUT,
    )
    tp_group = None
    # NOTE: every rank creates every stage's group, in the same order (torch.distributed requires it).
    for stage in range(rank.pp_size):
        group = dist.new_group(list(range(stage * rank.tp_size, (stage + 1) * rank.tp_size)))
        if stage == rank.pp_rank:
            tp_group = group
    assert tp_group is not None
    expert_parallel = parallel.enable_expert_parallel
    if device.type != "cuda" or rank.tp_size == 1 or parallel.all_reduce == "nccl":
        return Communicator(rank, tp_group, expert_parallel=expert_parallel)
    # NOTE: rank r of the stage sits on the device r places after its stage's first (see _device).
    first = (device.index or 0) - rank.tp_rank
    peers = [torch.device("cuda", first + tp_rank) for tp_rank in range(rank.tp_size)]
    peer_all_reduce = PeerAllReduce.create(tp_group, device, peers)
    return Communicator(rank, tp_group, peer_all_reduce, expert_parallel)


def _device(config: EngineConfig, world_rank: int) -> torch.device:
    device = resolve_device(config.model.device)
    if device.type != "cuda":
        # NOTE: the ranks already share the host's cores; intra-op threads on top only oversubscribe them.
        torch.set_num_threads(1)
        return device
    # NOTE: one device per rank, counted from the one configured (cuda means cuda:0).
    device = torch.device("cuda", (device.index or 0) + world_rank)
    torch.cuda.set_device(device)
    return device


def _serve(runner: ModelRunner, conn: Connection, answers: bool) -> None:
    """Run each step the engine sends; the output rank (`answers`) returns the steps' outputs in order.

    A step is launched as soon as its message arrives, before the previous step's tokens are read back: with async
    scheduling the engine sends step N+1 before it waits for step N's tokens, so the device finds N+1 queued behind
    N, as in an engine that runs its model in its own process. Waiting for N first would leave the device idle
    for the whole round trip (N's tokens to the engine, N+1's schedule back, its inputs prepared)."""
    in_flight: deque[PendingOutput] = deque()
    while True:
        if in_flight and in_flight[0].ready():
            conn.send_bytes(pickle.dumps(in_flight.popleft().result()))
            continue
        try:
            if in_flight and not conn.poll(_POLL_S):
                continue
            message = conn.recv_bytes()
        except EOFError:
            return
        if not message:
            return
        pending = runner.execute(pickle.loads(message))
        if answers:
            in_flight.append(pending)


def run_worker(
    world_rank: int, config: EngineConfig, model_path: Path, store: Path, conn: Connection, parent_pid: int
) -> None:
    """The worker process's entry point (torch.multiprocessing spawn); `parent_pid`: the engine's process, which
    the worker never outlives (its GPU memory goes with it)."""
    die_with_parent(parent_pid)
    parallel = config.parallel
    rank = ParallelRank.of_world_rank(world_rank, parallel.tensor_parallel_size, parallel.pipeline_parallel_size)
    try:
        device = _device(config, world_rank)
        runner = ModelRunner(config, model_path, device, _join(rank, device, store, parallel))
        pool = runner.kv_cache
        handle = PoolHandle.export(pool_bytes(pool)).to_dict() if pool.is_cuda else None
        conn.send(WorkerReady(runner.num_blocks, runner.max_model_len, str(device), runner.dtype, pool, handle))
        _serve(runner, conn, world_rank == output_rank(rank.tp_size, rank.pp_size))
    except Exception:
        logger.exception("worker rank %d failed", world_rank)
        conn.send(WorkerFailed(world_rank, traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
