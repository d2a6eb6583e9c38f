"""A one-command local pdserve cluster: Redis, prefill pods, decode pods and the router as child processes.

`LocalCluster.start()` starts Redis (a throwaway `redis-server`, unless `redis_url` names one), then the
pods and the router together (`python -m prefill_service|decode_service|router` on explicit free ports,
each logging to its own file), and waits until every process reports SERVING on grpc.health.v1 and
every pod is in the Redis registry; a process that exits early stops everything and raises
`ClusterError` with its log tail. `stop()` SIGTERMs the router, then every pod (they drain), waits,
kills what is left, and stops Redis last. The tests also add, stop and signal single pods, and stop
and restart Redis on the same port.

Telemetry: every process serves Prometheus /metrics (`--metrics-port`): the router on `metrics_port`, the
first prefill pod on `metrics_port + 1`, the first decode pod on `metrics_port + 2`, further pods on free
ports (all on free ports with `metrics_port=0`; none with None); `otlp_endpoint` goes to every process.

Every method blocks and may be called from any thread, also one running an event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from cli.redis_server import RedisServer
from common.errors import InvalidArgumentError
from common.grpc_server import wait_for_health
from common.pod_registry import PodInfo, PodRegistry, PodRole
from engine.config import DEFAULT_MODEL

logger = logging.getLogger(__name__)

T = TypeVar("T")
Role = Literal["router", "prefill", "decode"]

ENTRY_POINTS: Mapping[Role, tuple[str, ...]] = {
    "router": (sys.executable, "-m", "router"),
    "prefill": (sys.executable, "-m", "prefill_service"),
    "decode": (sys.executable, "-m", "decode_service"),
}
"""The command that starts each role; its flags follow (see the service conventions)."""

_POLL_S = 0.1
_LOG_TAIL_LINES = 30
DEFAULT_METRICS_PORT = 9100
_METRICS_PORT_OFFSETS: Mapping[Role, int] = {"router": 0, "prefill": 1, "decode": 2}


class ClusterError(RuntimeError):
    """A cluster process failed to start or exited; the message carries its log tail."""


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """What `LocalCluster` starts and how."""

    num_prefill: int = 1
    num_decode: int = 1
    host: str = "127.0.0.1"
    port: int = 50051
    """The router's port; 0 picks a free one."""
    redis_url: str | None = None
    """An existing Redis; None starts a throwaway redis-server (stopped with the cluster)."""
    model: str = DEFAULT_MODEL
    kv_transfer_backend: str = "tcp"
    registry_refresh_s: float = 1.0
    """How often the router re-reads the pod registry (its --registry-refresh-s)."""
    pod_args: tuple[str, ...] = ()
    """Extra flags for every pod (engine flags such as --num-blocks, --heartbeat-s)."""
    router_args: tuple[str, ...] = ()
    """Extra flags for the router."""
    log_dir: Path | None = None
    """Where each process writes `<name>.log`; None: a new temporary folder."""
    startup_timeout_s: float = 600.0
    stop_timeout_s: float = 35.0
    """How long a SIGTERMed process may take (pods drain in-flight requests) before it is killed."""
    show_progress: bool = False
    """A tqdm bar on stderr while the processes load."""
    metrics_port: int | None = DEFAULT_METRICS_PORT
    """The router's /metrics port; the first prefill and decode pods use the next two (see the module
    docstring); 0: free ports for every process; None: no /metrics endpoints."""
    otlp_endpoint: str | None = None
    """OTLP collector every process sends its spans to (their --otlp-endpoint); None: tracing off."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables of every process (e.g. OTEL_BSP_SCHEDULE_DELAY)."""
    entry_points: Mapping[Role, tuple[str, ...]] = field(default_factory=lambda: dict(ENTRY_POINTS))

    def __post_init__(self) -> None:
        for name in ("num_prefill", "num_decode"):
            if getattr(self, name) < 1:
                raise InvalidArgumentError(name, f"must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.port < 1 << 16:
            raise InvalidArgumentError("port", f"must be in [0, 65535], got {self.port}")
        if self.metrics_port is not None and not 0 <= self.metrics_port < (1 << 16) - 2:
            raise InvalidArgumentError("metrics_port", f"must be in [0, 65533], got {self.metrics_port}")


class ServiceProcess:
    """One child process of the cluster; stdout and stderr go to its own log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        address: str,
        log_path: Path,
        env: Mapping[str, str],
        metrics_url: str | None = None,
    ) -> None:
        self.name = name
        self.address = address
        """host:port of its gRPC server."""
        self.metrics_url = metrics_url
        """http://host:port/metrics of its Prometheus endpoint; None when it serves none."""
        self.log_path = log_path
        with log_path.open("ab") as log:
            # NOTE: a session of its own, so a Ctrl-C in the terminal reaches only the CLI, which then
            # stops the children in order (router first, Redis last) instead of all at once.
            self._popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=dict(env),
                start_new_session=True,
            )  # fmt: skip

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit code, or None while it runs."""
        return self._popen.poll()

    def send_signal(self, sig: signal.Signals) -> None:
        if self._popen.poll() is None:
            self._popen.send_signal(sig)

    def wait_or_kill(self, timeout_s: float) -> int:
        """Wait up to `timeout_s` for it to exit, then SIGKILL it; its exit code."""
        try:
            return self._popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("%s did not exit within %.1f s; killing it", self.name, timeout_s)
            self._popen.kill()
            return self._popen.wait()

    def log_tail(self, num_lines: int = _LOG_TAIL_LINES) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])
        except OSError as exc:
            return f"(no log: {exc})"


class LocalCluster:
    """Redis, `num_prefill` prefill pods, `num_decode` decode pods and a router on this machine."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix="pdserve-cluster-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.redis: RedisServer | None = None if config.redis_url else RedisServer()
        self.router: ServiceProcess | None = None
        self.pods: dict[str, ServiceProcess] = {}
        """Running pods by pod id, in start order."""
        self._next_index: dict[PodRole, int] = {"prefill": 0, "decode": 0}
        self._router_port = config.port or _free_port()

    @property
    def redis_url(self) -> str:
        return self.config.redis_url or self._owned_redis().url

    @property
    def router_address(self) -> str:
        """host:port where clients reach the router's GenerationService."""
        return f"{_connect_host(self.config.host)}:{self._router_port}"

    @property
    def metrics_urls(self) -> dict[str, str]:
        """The /metrics URL of each running process that serves one, by name (router first)."""
        return {p.name: p.metrics_url for p in self._processes() if p.metrics_url is not None}

    def start(self) -> None:
        """Start everything and wait until it serves; on any failure stop what started and raise."""
        try:
            if self.redis is not None:
                self.redis.start()
            pods = [self._spawn_pod("prefill") for _ in range(self.config.num_prefill)]
            pods += [self._spawn_pod("decode") for _ in range(self.config.num_decode)]
            self.router = self._spawn_router()
            self._run(self._wait_serving([*pods, self.router], [p.name for p in pods]))
        except BaseException:
            self.stop()
            raise
        # NOTE: the router reads the registry every registry_refresh_s; after one period it knows every pod.
        time.sleep(self.config.registry_refresh_s)
        logger.info("pdserve router listening on %s", self.router_address)

    def add_pod(self, role: PodRole, extra_args: Sequence[str] = ()) -> str:
        """Start one more pod; returns its pod id once it serves and is in the registry."""
        pod = self._spawn_pod(role, extra_args)
        try:
            self._run(self._wait_serving([pod], [pod.name]))
        except BaseException:
            self._stop_processes([pod])
            del self.pods[pod.name]
            raise
        return pod.name

    def stop_pod(self, pod: str | int, sig: signal.Signals = signal.SIGTERM, wait: bool = True) -> ServiceProcess:
        """Send `sig` to a pod (by id, or index into `pod_ids`) and drop it from `pods`; with `wait`, reap it
        (killing it after stop_timeout_s), so its `returncode` is set."""
        pod_id = self.pod_ids[pod] if isinstance(pod, int) else pod
        process = self.pods.pop(pod_id)
        process.send_signal(sig)
        if wait:
            process.wait_or_kill(self.config.stop_timeout_s)
        return process

    @property
    def pod_ids(self) -> list[str]:
        return list(self.pods)

    def pod_infos(self) -> list[PodInfo]:
        """The registry's view of every live pod (sorted by pod id)."""
        return self._run(_list_pods(self.redis_url))

    def stop_redis(self) -> None:
        """Stop the cluster's own redis-server (its port stays reserved for `start_redis`)."""
        self._owned_redis().stop()

    def start_redis(self) -> None:
        """Start the cluster's own redis-server again, on the same port and empty."""
        self._owned_redis().start()

    def poll_exited(self) -> ServiceProcess | None:
        """The first cluster process that has exited, if any."""
        return next((p for p in self._processes() if p.returncode is not None), None)

    def log_tails(self, num_lines: int = _LOG_TAIL_LINES) -> str:
        """The last lines of every process's log, one section per process."""
        return "\n".join(f"----- {p.name} ({p.log_path}) -----\n{p.log_tail(num_lines)}" for p in self._processes())

    def stop(self) -> None:
        """SIGTERM the router, then every pod; wait (kill after stop_timeout_s); stop Redis last. Idempotent."""
        router, self.router = self.router, None
        if router is not None:
            self._stop_processes([router])
        pods, self.pods = list(self.pods.values()), {}
        self._stop_processes(pods)
        if self.redis is not None:
            self.redis.stop()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _processes(self) -> list[ServiceProcess]:
        return [*([self.router] if self.router is not None else []), *self.pods.values()]

    def _spawn_pod(self, role: PodRole, extra_args: Sequence[str] = ()) -> ServiceProcess:
        pod_id = f"{role}-{self._next_index[role]}"
        self._next_index[role] += 1
        port = _free_port()
        args = [
            "--host", self.config.host, "--port", str(port), "--redis-url", self.redis_url, "--pod-id", pod_id,
            "--model", self.config.model, "--kv-transfer-backend", self.config.kv_transfer_backend,
            *self.config.pod_args, *extra_args,
        ]  # fmt: skip
        process = self._spawn(pod_id, role, port, args, first=self._next_index[role] == 1)
        self.pods[pod_id] = process
        return process

    def _spawn_router(self) -> ServiceProcess:
        args = [
            "--host", self.config.host, "--port", str(self._router_port), "--redis-url", self.redis_url,
            "--model", self.config.model, "--registry-refresh-s", str(self.config.registry_refresh_s),
            *self.config.router_args,
        ]  # fmt: skip
        return self._spawn("router", "router", self._router_port, args, first=True)

    def _spawn(self, name: str, role: Role, port: int, args: Sequence[str], first: bool) -> ServiceProcess:
        """Start one process; `first`: the first of its role (it gets the role's default metrics port)."""
        telemetry: list[str] = []
        metrics_url: str | None = None
        if self.config.otlp_endpoint is not None:
            telemetry += ["--otlp-endpoint", self.config.otlp_endpoint]
        if self.config.metrics_port is not None:
            base = self.config.metrics_port
            metrics_port = base + _METRICS_PORT_OFFSETS[role] if base and first else _free_port()
            telemetry += ["--metrics-port", str(metrics_port), "--metrics-host", self.config.host]
            metrics_url = f"http://{_connect_host(self.config.host)}:{metrics_port}/metrics"
        argv = [*self.config.entry_points[role], *args, *telemetry]
        address = f"{_connect_host(self.config.host)}:{port}"
        process = ServiceProcess(name, argv, address, self.log_dir / f"{name}.log", self._child_env(), metrics_url)
        logger.info("started %s (pid %d), logging to %s", name, process.pid, process.log_path)
        return process

    async def _wait_serving(self, processes: Sequence[ServiceProcess], pod_ids: Sequence[str]) -> None:
        """Wait until each process is SERVING and each pod id is registered (and not draining)."""
        started = time.monotonic()
        timeout_s = self.config.startup_timeout_s
        show = self.config.show_progress
        with (
            logging_redirect_tqdm(),
            tqdm(total=len(processes), desc="starting pdserve", unit="proc", disable=not show, file=sys.stderr) as bar,
        ):

            async def one(process: ServiceProcess) -> None:
                await _serving(process, timeout_s)
                bar.update(1)
                logger.info("%s serving on %s after %.1f s", process.name, process.address, time.monotonic() - started)

            await asyncio.gather(*(one(p) for p in processes))
        await _registered(self.redis_url, pod_ids, timeout_s - (time.monotonic() - started))

    def _stop_processes(self, processes: Sequence[ServiceProcess]) -> None:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            code = process.wait_or_kill(self.config.stop_timeout_s)
            logger.info("%s exited with code %s", process.name, code)

    def _child_env(self) -> dict[str, str]:
        env = {**os.environ, **self.config.env, "PYTHONUNBUFFERED": "1"}
        # NOTE: pods on a shared CPU fight over cores; one torch thread pool per pod sized to its share
        # runs faster than every pod spinning up a thread per core. An explicit OMP_NUM_THREADS wins.
        num_pods = max(1, self.config.num_prefill + self.config.num_decode)
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // num_pods)))
        return env

    def _owned_redis(self) -> RedisServer:
        if self.redis is None:
            raise RuntimeError("the cluster uses an external Redis (redis_url); it cannot stop or start it")
        return self.redis

    @staticmethod
    def _run(coro: Coroutine[Any, Any, T]) -> T:
        # NOTE: a fresh loop on a worker thread, so callers inside a running event loop can block on it too.
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pdserve-cluster") as pool:
            return pool.submit(asyncio.run, coro).result()


async def _serving(process: ServiceProcess, timeout_s: float) -> None:
    """Wait for SERVING; raise ClusterError (with the log tail) if the process exits or times out first."""
    health = asyncio.ensure_future(wait_for_health(process.address, timeout_s))
    try:
        while not health.done():
            if process.returncode is not None:
                raise ClusterError(f"{process.name} exited with code {process.returncode} while starting; "
                                   f"log tail ({process.log_path}):\n{process.log_tail()}")  # fmt: skip
            await asyncio.wait([health], timeout=_POLL_S)
        health.result()
    except TimeoutError as exc:
        raise ClusterError(f"{exc}; log tail of {process.name} ({process.log_path}):\n{process.log_tail()}") from exc
    finally:
        health.cancel()


async def _registered(redis_url: str, pod_ids: Sequence[str], timeout_s: float) -> None:
    """Wait until every pod id is in the registry and not draining."""
    registry = PodRegistry(redis_url)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            live = {pod.pod_id for pod in await registry.list_pods() if not pod.draining}
            missing = sorted(set(pod_ids) - live)
            if not missing:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"pods {missing} serve but are not in the registry at {redis_url}")
            await asyncio.sleep(_POLL_S)
    finally:
        await registry.aclose()


async def _list_pods(redis_url: str) -> list[PodInfo]:
    registry = PodRegistry(redis_url)
    try:
        return await registry.list_pods()
    finally:
        await registry.aclose()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _connect_host(bind_host: str) -> str:
    """The host a local client connects to for a server bound to `bind_host`."""
    return "127.0.0.1" if bind_host in ("0.0.0.0", "::", "") else bind_host
