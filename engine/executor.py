"""The executor seam: what the engine needs of whatever runs its model, in-process or in worker processes.

`make_executor` picks once at start-up: a `ModelRunner` in the engine's process for one device, a
`ParallelExecutor` driving one worker process per device for tensor_parallel_size x pipeline_parallel_size > 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from engine.config import EngineConfig
from engine.models.arch_config import ArchConfig
from engine.scheduler_output import RunnerOutput, SchedulerOutput


class PendingResult(Protocol):
    def result(self) -> RunnerOutput:
        """Wait for the step's sampled tokens."""
        ...


class Executor(Protocol):
    arch: ArchConfig
    device: torch.device
    dtype: torch.dtype
    num_blocks: int
    max_model_len: int

    @property
    def kv_pools(self) -> list[torch.Tensor]:
        """Each rank's KV pool, in rank order (tensors the engine's process can read and write)."""
        ...

    @property
    def kv_pool_handles(self) -> list[dict[str, Any] | None]:
        """Each rank's pool's CUDA IPC handle as the process that allocated it exported it; None for a pool of the
        engine's own process or on the CPU (see `kv_transfer.pool_view.KVPoolView.ipc_handle`)."""
        ...

    def execute(self, scheduler_output: SchedulerOutput) -> PendingResult:
        """Enqueue the step; its sampled tokens arrive through the returned handle."""
        ...


def make_executor(config: EngineConfig, model_path: Path, draft_block_nbytes: int = 0) -> Executor:
    """`draft_block_nbytes`: a draft model's KV bytes per block, paid from the pool budget (one device only)."""
    if config.parallel.world_size == 1:
        from engine.model_runner import ModelRunner

        return ModelRunner(config, model_path, draft_block_nbytes=draft_block_nbytes)
    from engine.parallel.executor import ParallelExecutor

    return ParallelExecutor(config, model_path)
