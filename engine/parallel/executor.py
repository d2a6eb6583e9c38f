"""The engine's side of a parallel engine: starts one worker process per rank and drives them step by step.

Lifecycle: check that the sizes split the model -> spawn tensor_parallel_size x pipeline_parallel_size workers
(`engine.parallel.worker`; each dies with this process, however it ends: `common.child_process`) -> wait for
every `WorkerReady` (KV pool sizes agree: the workers took the minimum) -> per step, send the pickled
`SchedulerOutput` to every worker (one pickle, N pipe writes) and read the `RunnerOutput` from the output rank ->
`close` (or the engine's exit) stops them.

A worker that dies or fails is seen at once: every wait also watches each worker's process sentinel, so a
death raises `WorkerDiedError` instead of a hang, and the remaining workers are stopped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import tempfile
import weakref
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path

import torch
import torch.multiprocessing as mp

from common.child_process import on_spawner_thread
from engine.config import EngineConfig
from engine.models.arch_config import ArchConfig
from engine.parallel.rank import check_parallel_sizes
from engine.parallel.worker import WorkerFailed, WorkerReady, output_rank, run_worker
from engine.scheduler_output import RunnerOutput, SchedulerOutput

logger = logging.getLogger(__name__)

_STOP_GRACE_S = 5.0


class WorkerDiedError(RuntimeError):
    """A worker process of a parallel engine exited or failed: the engine cannot run another step."""


class _PendingStep:
    def __init__(self, executor: ParallelExecutor) -> None:
        self._executor = executor

    def result(self) -> RunnerOutput:
        output = self._executor.receive(self._executor.output_conn)
        assert isinstance(output, RunnerOutput)
        return output


class ParallelExecutor:
    def __init__(self, config: EngineConfig, model_path: Path) -> None:
        parallel = config.parallel
        self.arch = ArchConfig.from_folder(model_path)
        check_parallel_sizes(
            self.arch, parallel.tensor_parallel_size, parallel.pipeline_parallel_size, parallel.enable_expert_parallel
        )
        self._store_dir = tempfile.TemporaryDirectory(prefix="pdserve-dist-")
        store = Path(self._store_dir.name) / "store"
        ctx = mp.get_context("spawn")
        self.processes: list[BaseProcess] = []
        self.conns: list[Connection] = []
        for world_rank in range(parallel.world_size):
            conn, child_conn = ctx.Pipe()
            process = ctx.Process(
                target=run_worker,
                args=(world_rank, config, model_path, store, child_conn, os.getpid()),
                daemon=True,
                name=f"pdserve-worker-{world_rank}",
            )
            # NOTE: started from the spawner thread, whose life the workers' parent-death signal is tied to: the
            # thread building the engine may end long before the engine (a pod builds it in asyncio.to_thread).
            on_spawner_thread(process.start)
            child_conn.close()
            self.processes.append(process)
            self.conns.append(conn)
        self._finalizer = weakref.finalize(self, _stop, self.processes, self.conns)
        self.output_conn = self.conns[output_rank(parallel.tensor_parallel_size, parallel.pipeline_parallel_size)]
        readies = [self.receive(conn) for conn in self.conns]
        ready = readies[0]
        assert isinstance(ready, WorkerReady)
        self.device = torch.device(ready.device)
        self.dtype = ready.dtype
        self.num_blocks = ready.num_blocks
        self.max_model_len = ready.max_model_len
        self.kv_pools = [r.kv_pool for r in readies if isinstance(r, WorkerReady)]
        self.kv_pool_handles = [r.kv_pool_handle for r in readies if isinstance(r, WorkerReady)]
        logger.info(
            "%d workers ready (TP %d x PP %d)",
            parallel.world_size,
            parallel.tensor_parallel_size,
            parallel.pipeline_parallel_size,
        )

    def receive(self, conn: Connection) -> object:
        """The next message on `conn`; WorkerDiedError if any worker fails or exits first."""
        ready = wait([conn, *(p.sentinel for p in self.processes)])
        if conn in ready:
            message = conn.recv()
            if not isinstance(message, WorkerFailed):
                return message
            self._abort()
            raise WorkerDiedError(f"worker rank {message.world_rank} failed:\n{message.error}")
        dead = [rank for rank, p in enumerate(self.processes) if p.sentinel in ready]
        codes = [self.processes[rank].exitcode for rank in dead]
        self._abort()
        raise WorkerDiedError(f"worker rank(s) {dead} exited (exit codes {codes})")

    def execute(self, scheduler_output: SchedulerOutput) -> _PendingStep:
        message = pickle.dumps(scheduler_output)
        try:
            for conn in self.conns:
                conn.send_bytes(message)
        except OSError as exc:
            self._abort()
            raise WorkerDiedError(f"a worker's pipe closed: {exc}") from exc
        return _PendingStep(self)

    def close(self) -> None:
        """Stop every worker (idempotent)."""
        self._finalizer()

    def _abort(self) -> None:
        """After a failure: the surviving workers may wait in a collective for the dead one, so kill them."""
        for process in self.processes:
            if process.is_alive():
                process.kill()
        self._finalizer()


def _stop(processes: list[BaseProcess], conns: list[Connection]) -> None:
    for conn in conns:
        with contextlib.suppress(OSError):
            conn.send_bytes(b"")
        conn.close()
    for process in processes:
        process.join(_STOP_GRACE_S)
        if process.is_alive():
            process.kill()
            process.join()
