"""`pdserve router --workers N` with N > 1: one router served by N processes on the same ports, and their supervisor.

1. `supervise(...)`: a run folder of its own (mode 0700, removed at exit) for the workers' private Unix sockets, the
   counts table (router.processes.shared_counts), the Prometheus multiprocess files and the workers' configuration; with
   `--port 0` a free port is reserved first (a bound, never listening SO_REUSEPORT socket, held to the end), so that
   every worker, restarted ones too, binds the same one.
2. /metrics on `--metrics-port`, served here: every worker's metrics, summed (common.metrics.multiprocess_registry).
3. N workers start (`python -m router.processes.worker <run folder> <index>`), each binding the gRPC port (and
   `--http-port`) with SO_REUSEPORT: the kernel hands each new connection to one of them, and every call on that
   connection goes to that worker. Once every worker says it serves, `pdserve router serving on <host:port>` is printed,
   as a lone router prints it.
4. A worker that exits while no stop was asked is logged, its counts row zeroed and its live gauges dropped, and it
   is started again after RESTART_DELAY_S (doubling while its restarts fail, up to MAX_RESTART_DELAY_S). A worker
   that exits before the first start completed stops everything (exit 1): a bad configuration fails every worker.
5. SIGTERM or SIGINT is forwarded (as SIGTERM) to every worker, which drains as a lone router does; nothing restarts
   any more; the supervisor exits once every worker has, 0 if each drained cleanly. A worker still running
   `drain_timeout_s` + STOP_MARGIN_S after the signal is killed.
Workers die with the supervisor: each asks the kernel for SIGKILL when its parent goes (router.processes.worker).

Which state is whose:
- cluster-wide, in Redis, the same for every process: the pod registry and the prefix directory. The routing policy
  is configuration, the same in every process.
- the whole router's, in the run folder: the counts table (running requests now: GetLoad; and admission's counts,
  so that its limits mean the same whatever N: calls queued in the router, calls in flight to the prefill pods and
  their prompt tokens, streams per client, and the first tokens of the last seconds for the drain rate:
  router.admission.admission_state), the metrics files.
- each process's own: its running requests by id (router.completion.running_requests: an Abort reaching any process is
  fanned out to the others, router.processes.sibling_aborts); admission's tickets and the waiters of its queue
  (router.admission.wait_queue: a process wakes only its own; with siblings it re-checks the shared counts while it has
  waiters, router.admission.admission); local loads (router.pods.local_load: what this process put on each pod since the
  last registry read); the retry budget (router.completion.migration: 1/N of the router's each); the pod view, its
  channels and decode streams; the tokenizer pool (its share of `--tokenizer-pool-size`); health and the drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from common.metrics import forget_process, multiprocess_registry, serve_metrics
from common.telemetry_config import TelemetryConfig
from router.config import RouterConfig, RoutingConfig
from router.processes.router_process import RouterProcess
from router.processes.shared_counts import SharedCounts
from router.security import RouterSecurity

logger = logging.getLogger("router.processes.supervisor")

RESTART_DELAY_S = 1.0
MAX_RESTART_DELAY_S = 30.0
STOP_MARGIN_S = 10.0
"""How long past its drain timeout a worker may take to exit after SIGTERM before it is killed."""
SPEC_FILE = "worker-spec.pickle"
METRICS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What every worker is started with: the router's configs (`config.port` the port they all bind), their
    number, and the supervisor's pid (a worker whose parent is not it exits at once)."""

    config: RouterConfig
    routing: RoutingConfig
    telemetry: TelemetryConfig
    security: RouterSecurity
    num_workers: int
    supervisor_pid: int

    def write(self, run_dir: Path) -> None:
        (run_dir / SPEC_FILE).write_bytes(pickle.dumps(self))

    @staticmethod
    def read(run_dir: Path) -> WorkerSpec:
        spec = pickle.loads((run_dir / SPEC_FILE).read_bytes())
        if not isinstance(spec, WorkerSpec):
            raise TypeError(f"{run_dir / SPEC_FILE} holds no WorkerSpec")
        return spec


def supervise(
    config: RouterConfig,
    routing: RoutingConfig,
    telemetry: TelemetryConfig,
    security: RouterSecurity,
    num_workers: int,
) -> int:
    """Serve the router from `num_workers` processes until SIGTERM or SIGINT (see the module docstring); the exit
    code."""
    run_dir = Path(tempfile.mkdtemp(prefix="pdserve-router-"))
    reserved: socket.socket | None = None
    try:
        if not config.port:
            reserved = _reserve_port(config.host)
            config = dataclasses.replace(config, port=reserved.getsockname()[1])
        spec = WorkerSpec(config, routing, telemetry, security, num_workers, os.getpid())
        spec.write(run_dir)
        layout = RouterProcess(0, num_workers, run_dir)
        layout.metrics_dir.mkdir()
        counts = SharedCounts.create(layout.counts_path, num_workers)
        metrics_server = None
        if telemetry.metrics_port is not None:
            metrics_server = serve_metrics(
                multiprocess_registry(layout.metrics_dir), telemetry.metrics_port, telemetry.metrics_host
            )
            logger.info(
                "metrics of every worker on http://%s:%d/metrics", telemetry.metrics_host, metrics_server.server_port
            )
        try:
            return asyncio.run(Supervisor(spec, run_dir, counts).run())
        finally:
            if metrics_server is not None:
                metrics_server.shutdown()
                metrics_server.server_close()
            counts.close()
    finally:
        if reserved is not None:
            reserved.close()
        shutil.rmtree(run_dir, ignore_errors=True)


def _reserve_port(host: str) -> socket.socket:
    """A socket bound to a free port of `host` with SO_REUSEPORT, never listening: it takes no connection, and it
    keeps the port for the workers, which bind it with SO_REUSEPORT too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    reserved = socket.socket(family, socket.SOCK_STREAM)
    reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    reserved.bind((host, 0))
    return reserved


class Supervisor:
    """The worker processes of one router: started, restarted when they die, stopped on a signal."""

    def __init__(self, spec: WorkerSpec, run_dir: Path, counts: SharedCounts) -> None:
        self._spec = spec
        self._run_dir = run_dir
        self._counts = counts
        self._metrics_dir = RouterProcess(0, spec.num_workers, run_dir).metrics_dir
        self._env = {**os.environ, METRICS_DIR_VARIABLE: str(self._metrics_dir)}
        self._workers: list[asyncio.subprocess.Process | None] = [None] * spec.num_workers
        self._relays: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()

    async def run(self) -> int:
        """Start every worker, keep them running until a signal, wait for them to exit; the exit code."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stop)
        started = await asyncio.gather(*(self._start(index) for index in range(self._spec.num_workers)))
        if not all(started):
            self.stop()
            await asyncio.gather(*(worker.wait() for worker in self._workers if worker is not None))
            return 1
        if not self._stopping.is_set():
            config = self._spec.config
            print(f"pdserve router serving on {config.host}:{config.port}", flush=True)
            logger.info("%d worker processes (pids %s)", len(self._workers), [w.pid for w in self._workers if w])
        codes = await asyncio.gather(*(self._keep(index) for index in range(self._spec.num_workers)))
        # NOTE: a worker's tokenizer processes inherit its stdout and may outlive it by a moment: not waited for.
        for relay in list(self._relays):
            relay.cancel()
        await asyncio.gather(*self._relays, return_exceptions=True)
        return 0 if all(code in (0, -signal.SIGTERM) for code in codes) else 1

    def stop(self) -> None:
        """Drain every worker (SIGTERM), restart none; kill those still running after their drain and a margin."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        logger.info("stopping: every worker drains")
        for index in range(len(self._workers)):
            self._signal(index, signal.SIGTERM)
        kill_after_s = self._spec.config.drain_timeout_s + STOP_MARGIN_S
        asyncio.get_running_loop().call_later(kill_after_s, self._kill_all)

    async def _start(self, index: int) -> bool:
        """Start worker `index` and wait until it serves; False if it exited first."""
        command = [sys.executable, "-m", "router.processes.worker", str(self._run_dir), str(index)]
        worker = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, env=self._env
        )
        self._workers[index] = worker
        if self._stopping.is_set():
            self._signal(index, signal.SIGTERM)
        assert worker.stdout is not None
        if not await worker.stdout.readline():
            code = await worker.wait()
            logger.error("router worker %d (pid %d) exited with code %d before serving", index, worker.pid, code)
            return False
        relay = asyncio.create_task(_relay(worker.stdout), name=f"relay-{index}")
        self._relays.add(relay)
        relay.add_done_callback(self._relays.discard)
        return True

    async def _keep(self, index: int) -> int:
        """Restart worker `index` whenever it exits, until a stop; its last exit code."""
        delay_s = RESTART_DELAY_S
        while True:
            worker = self._workers[index]
            assert worker is not None
            code = await worker.wait()
            if self._stopping.is_set():
                return code
            logger.warning(
                "router worker %d (pid %d) exited with code %d; restarting it in %.1f s",
                index,
                worker.pid,
                code,
                delay_s,
            )
            self._counts.clear_row(index)
            forget_process(worker.pid, self._metrics_dir)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay_s)
                return code
            delay_s = RESTART_DELAY_S if await self._start(index) else min(2 * delay_s, MAX_RESTART_DELAY_S)

    def _signal(self, index: int, signum: signal.Signals) -> None:
        worker = self._workers[index]
        if worker is not None and worker.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                worker.send_signal(signum)

    def _kill_all(self) -> None:
        for index, worker in enumerate(self._workers):
            if worker is not None and worker.returncode is None:
                logger.warning("router worker %d (pid %d) still runs after its drain; killing it", index, worker.pid)
                self._signal(index, signal.SIGKILL)


async def _relay(stream: asyncio.StreamReader) -> None:
    """Copy what a worker prints after its serving line to this process's stdout (so its pipe never fills)."""
    async for line in stream:
        sys.stdout.buffer.write(line)
        sys.stdout.flush()
