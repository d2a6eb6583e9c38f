"""Which of the router's processes this one is (`RouterProcess`), and how many serve its port (`num_workers`).

A router runs as one process, or as N (`--workers N`, router.processes.supervisor) that serve the same ports. What each
of them shares with its siblings lives in the supervisor's run folder: each process's private Unix socket (Abort by
request id is forwarded over them, router.processes.sibling_aborts), the counts table (router.processes.shared_counts)
and the Prometheus multiprocess files (/metrics of the whole router). Figures the flags give for the whole router are
split here: each process holds its `share` of the retry budget and of the tokenizer pool.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

CORES_PER_WORKER = 4
MAX_DEFAULT_WORKERS = 8


def default_num_workers(num_cpus: int) -> int:
    """Router processes when `--workers` is 0: one per CORES_PER_WORKER cores, at least 1, at most
    MAX_DEFAULT_WORKERS.

    NOTE: a router process is one event loop, about one core at full load; the host also runs its tokenizer workers
    and, usually, pods (an engine core and a front process each, both busy), so a quarter of the cores goes to the
    router. Beyond 8, every Abort fans out to more siblings and each process holds its own pod streams, for a port
    that seldom needs more.
    """
    return min(MAX_DEFAULT_WORKERS, max(1, num_cpus // CORES_PER_WORKER))


def num_workers(configured: int) -> int:
    """The router's process count: `configured` (its --workers), or with 0 `default_num_workers` of the cores this
    process may run on."""
    return configured or default_num_workers(len(os.sched_getaffinity(0)))


@dataclass(frozen=True, slots=True)
class RouterProcess:
    """Process `index` of the `count` that serve the router's ports; `run_dir` is the supervisor's folder (None: a
    lone process, no supervisor)."""

    index: int = 0
    count: int = 1
    run_dir: Path | None = None

    @property
    def grouped(self) -> bool:
        """Whether siblings share the ports (and the run folder) with this process."""
        return self.run_dir is not None

    def socket_path(self, index: int) -> Path:
        """The private Unix socket of process `index` (its gRPC server's second port)."""
        return self._folder() / f"router-{index}.sock"

    def address(self) -> str:
        """This process's private gRPC address (`unix:<path>`)."""
        return f"unix:{self.socket_path(self.index)}"

    def sibling_addresses(self) -> list[str]:
        """The private gRPC addresses of every other process."""
        return [f"unix:{self.socket_path(i)}" for i in range(self.count) if i != self.index]

    @property
    def counts_path(self) -> Path:
        """The counts table every process maps (router.processes.shared_counts)."""
        return self._folder() / "counts"

    @property
    def metrics_dir(self) -> Path:
        """Where every process writes its Prometheus metrics (PROMETHEUS_MULTIPROC_DIR)."""
        return self._folder() / "metrics"

    def share(self, total: float) -> float:
        """This process's part of a figure given for the whole router (e.g. retries per second)."""
        return total / self.count

    def tokenizer_pool_size(self, total: int) -> int:
        """Tokenizer workers of this process when the whole router may run `total`: an even share, at least one."""
        return max(1, math.ceil(total / self.count))

    def _folder(self) -> Path:
        if self.run_dir is None:
            raise RuntimeError("a lone router process has no run folder")
        return self.run_dir
