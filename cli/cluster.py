"""A one-command local pdserve cluster: Redis, prefill pods, decode pods and the router as child processes.

`LocalCluster.start()` starts Redis (a throwaway `redis-server`, unless `redis_url` names one), then the
pods and the router together (`python -m prefill_service|decode_service|router` on explicit free ports,
each logging to its own file), and waits until every process reports SERVING on grpc.health.v1 and
every pod is in the Redis registry; a process that exits early stops everything and raises
`ClusterError` with its log tail. `stop()` SIGTERMs the router, then every pod (they drain), waits,
kills what is left, and stops Redis last. Single pods can be added (`add_pod`) and drained in the background
(`drain_pod`, the autoscaler's local connector); the tests also stop and signal single pods, and stop and
restart Redis on the same port.

What it starts, and each process's /metrics port, is a `ClusterConfig` (cli.cluster_config); each child is a
`ServiceProcess` (cli.service_process). With `credentials` every process gets the `PDSERVE_*` variables that turn on
tokens, TLS and mTLS, its own Redis requires a password over TLS, and the Redis URL (it carries the password)
reaches the processes in `PDSERVE_REDIS_URL`, never on a command line.

Every method blocks and may be called from any thread, also one running an event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import signal
import tempfile
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from cli.child_env import ChildEnvironment
from cli.cluster_config import METRICS_PORT_OFFSETS, ClusterConfig, Role
from cli.cluster_startup import list_pods, wait_serving
from cli.gpu_slots import GpuSlots
from cli.ports import connect_host, free_port
from cli.redis_server import RedisServer
from cli.service_process import LOG_TAIL_LINES, ClusterError, ServiceProcess
from common.config import env_name
from common.pod_registry import PodInfo, PodRole

logger = logging.getLogger(__name__)
_GPU_POLL_S = 0.2

T = TypeVar("T")


class LocalCluster:
    """Redis, `num_prefill` prefill pods, `num_decode` decode pods and a router on this machine."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix="pdserve-cluster-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.redis: RedisServer | None = None
        if not config.redis_url:
            secure = config.credentials
            self.redis = (
                RedisServer() if secure is None else RedisServer(password=secure.redis_password, tls=secure.redis_tls())
            )
        self.router: ServiceProcess | None = None
        self.pods: dict[str, ServiceProcess] = {}
        """Running pods by pod id, in start order."""
        self.draining: dict[str, ServiceProcess] = {}
        self.drained_exits: dict[str, int] = {}
        """The exit code of every drained pod reaped so far, by pod id."""
        """Pods `drain_pod` sent SIGTERM that have not exited yet (no longer in `pods`)."""
        self._stopped = False
        self._next_index: dict[PodRole, int] = {"prefill": 0, "decode": 0}
        self._gpus = GpuSlots(config)
        self._router_port = config.port or free_port()
        self._env = ChildEnvironment({**config.env, **self._secure_env()}, config.num_prefill + config.num_decode)

    @property
    def redis_url(self) -> str:
        return self.config.redis_url or self._owned_redis().url

    @property
    def router_address(self) -> str:
        """host:port where clients reach the router's GenerationService."""
        return f"{connect_host(self.config.host)}:{self._router_port}"

    @property
    def http_url(self) -> str | None:
        """Base URL of the router's HTTP API (`http://host:port`, `https://` with credentials); None when it is off."""
        if not self.config.http_port:
            return None
        scheme = "http" if self.config.credentials is None else "https"
        return f"{scheme}://{connect_host(self.config.host)}:{self.config.http_port}"

    @property
    def metrics_urls(self) -> dict[str, str]:
        """The /metrics URL of each running process that serves one, by name (router first)."""
        return {p.name: p.metrics_url for p in self._processes() if p.metrics_url is not None}

    def start(self) -> None:
        """Start everything and wait until it serves; on any failure stop what started and raise."""
        self._stopped = False
        try:
            if self.redis is not None:
                self.redis.start()
            pods = [self._spawn_pod("prefill") for _ in range(self.config.num_prefill)]
            pods += [self._spawn_pod("decode") for _ in range(self.config.num_decode)]
            self.router = self._spawn_router()
            self._run(wait_serving(self.config, self.redis_url, [*pods, self.router], [p.name for p in pods]))
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
            self._run(wait_serving(self.config, self.redis_url, [pod], [pod.name]))
        except BaseException:
            self._stop_processes([pod])
            # NOTE: a `stop()` from another thread meanwhile already took it out of `pods`.
            self.pods.pop(pod.name, None)
            self._gpus.release(pod.name)
            raise
        return pod.name

    def drain_pod(self, pod_id: str) -> ServiceProcess:
        """SIGTERM a pod without waiting: it leaves `pods` at once and stays in `draining` until it exits (it
        drains its requests first); `stop()` waits for it."""
        self.reap_drained()
        process = self.stop_pod(pod_id, wait=False)
        self.draining[pod_id] = process
        return process

    def reap_drained(self) -> dict[str, int]:
        """Forget the draining pods that have exited (their codes stay in `drained_exits`); their exit codes by pod
        id."""
        exited = {name: code for name, p in list(self.draining.items()) if (code := p.returncode) is not None}
        for name, code in exited.items():
            del self.draining[name]
            self._gpus.release(name)
            logger.info("%s (drained) exited with code %s", name, code)
        self.drained_exits.update(exited)
        return exited

    def wait_for_free_gpu(self, timeout_s: float) -> bool:
        """Wait (up to `timeout_s`) until a GPU that only draining pods hold is free, if there is one; whether the
        next pod's GPU (`ClusterConfig.next_gpu`) is then one no live pod holds. True without `gpus`."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.reap_drained()
            if self._gpus.next_is_free([*self.pods, *self.draining]):
                return True
            if not self.draining or time.monotonic() >= deadline:
                return False
            time.sleep(_GPU_POLL_S)

    def gpus_held(self) -> set[str]:
        """The ids (of `gpus`) of the GPUs that running pods, and draining pods not yet exited, hold; empty without
        `gpus`."""
        live = [*self.pods, *(name for name, p in list(self.draining.items()) if p.returncode is None)]
        return {self.config.gpus[gpu] for gpu in self._gpus.taken(live)}

    def stop_pod(self, pod: str | int, sig: signal.Signals = signal.SIGTERM, wait: bool = True) -> ServiceProcess:
        """Send `sig` to a pod (by id, or index into `pod_ids`) and drop it from `pods`; with `wait`, reap it
        (killing it after stop_timeout_s), so its `returncode` is set."""
        pod_id = self.pod_ids[pod] if isinstance(pod, int) else pod
        process = self.pods.pop(pod_id)
        process.send_signal(sig)
        if wait:
            process.wait_or_kill(self.config.stop_timeout_s)
            self._gpus.release(pod_id)
        return process

    @property
    def pod_ids(self) -> list[str]:
        return list(self.pods)

    def pod_infos(self) -> list[PodInfo]:
        """The registry's view of every live pod (sorted by pod id)."""
        return self._run(list_pods(self.redis_url))

    def restart_router(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Send `sig` to the router, reap it (killing it after stop_timeout_s) and start a new one on the same port;
        returns once it serves."""
        if self.router is not None:
            self.router.send_signal(sig)
            self.router.wait_or_kill(self.config.stop_timeout_s)
        self.router = self._spawn_router()
        self._run(wait_serving(self.config, self.redis_url, [self.router], []))

    def stop_redis(self) -> None:
        """Stop the cluster's own redis-server (its port stays reserved for `start_redis`)."""
        self._owned_redis().stop()

    def start_redis(self) -> None:
        """Start the cluster's own redis-server again, on the same port and empty."""
        self._owned_redis().start()

    def poll_exited(self) -> ServiceProcess | None:
        """The first cluster process that has exited, if any."""
        return next((p for p in self._processes() if p.returncode is not None), None)

    def log_tails(self, num_lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of every process's log, one section per process."""
        return "\n".join(f"----- {p.name} ({p.log_path}) -----\n{p.log_tail(num_lines)}" for p in self._processes())

    def stop(self) -> None:
        """SIGTERM the router, then every pod; wait (kill after stop_timeout_s); stop Redis last. Idempotent."""
        # NOTE: set first, so an `add_pod` on another thread starts no pod that this stop would miss.
        self._stopped = True
        router, self.router = self.router, None
        if router is not None:
            self._stop_processes([router])
        pods, self.pods = list(self.pods.values()), {}
        self._stop_processes(pods)
        draining, self.draining = list(self.draining.values()), {}
        for process in draining:
            code = process.wait_or_kill(self.config.stop_timeout_s)
            logger.info("%s (drained) exited with code %s", process.name, code)
            self.drained_exits[process.name] = code
        if self.redis is not None:
            self.redis.stop()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _processes(self) -> list[ServiceProcess]:
        # NOTE: copied in one step (no Python code runs during it): other threads may add and drain pods.
        return [*([self.router] if self.router is not None else []), *self.pods.values()]

    def _secure_env(self) -> dict[str, str]:
        """With credentials: their variables and the Redis URL (which carries the password); else none."""
        credentials = self.config.credentials
        if credentials is None:
            return {}
        return {**credentials.process_env(), env_name("redis_url"): self.redis_url}

    def _redis_args(self) -> list[str]:
        return [] if self.config.credentials is not None else ["--redis-url", self.redis_url]

    def _spawn_pod(self, role: PodRole, extra_args: Sequence[str] = ()) -> ServiceProcess:
        if self._stopped:
            raise ClusterError(f"the cluster is stopped; no new {role} pod")
        pod_id = f"{role}-{self._next_index[role]}"
        self._next_index[role] += 1
        port = free_port()
        args = [
            "--host",
            self.config.host,
            "--port",
            str(port),
            *self._redis_args(),
            "--pod-id",
            pod_id,
            "--model",
            self.config.model,
            "--kv-transfer-backend",
            self.config.kv_transfer_backend,
        ]
        user_args = [*self.config.pod_args, *extra_args]
        devices = self._gpus.take(pod_id, [*self.pods, *self.draining])
        process = self._spawn(pod_id, role, port, args, user_args, first=self._next_index[role] == 1, devices=devices)
        self.pods[pod_id] = process
        return process

    def _spawn_router(self) -> ServiceProcess:
        args = [
            "--host",
            self.config.host,
            "--port",
            str(self._router_port),
            *self._redis_args(),
            "--model",
            self.config.model,
            "--registry-refresh-s",
            str(self.config.registry_refresh_s),
            "--http-port",
            str(self.config.http_port),
        ]
        if self.config.router_workers is not None:
            args += ["--workers", str(self.config.router_workers)]
        return self._spawn("router", "router", self._router_port, args, self.config.router_args, first=True)

    def _spawn(
        self,
        name: str,
        role: Role,
        port: int,
        args: Sequence[str],
        user_args: Sequence[str],
        first: bool,
        devices: str | None = None,
    ) -> ServiceProcess:
        """Start one process with the cluster's `args` and the caller's `user_args`; `first`: the first of its
        role (it gets the role's default metrics port); `devices`: its CUDA_VISIBLE_DEVICES (None: inherited)."""
        telemetry: list[str] = []
        metrics_url: str | None = None
        if self.config.otlp_endpoint is not None:
            telemetry += ["--otlp-endpoint", self.config.otlp_endpoint]
        if self.config.metrics_port is not None:
            base = self.config.metrics_port
            metrics_port = base + METRICS_PORT_OFFSETS[role] if base and first else free_port()
            telemetry += ["--metrics-port", str(metrics_port), "--metrics-host", self.config.host]
            metrics_url = f"http://{connect_host(self.config.host)}:{metrics_port}/metrics"
        argv = [*self.config.entry_points[role], *args, *user_args, *telemetry]
        address = f"{connect_host(self.config.host)}:{port}"
        env = self._env.for_process([*args, *telemetry])
        if devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = devices
            # NOTE: nvidia-smi's numbering (where the default ids come from), unless the caller chose an order.
            env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        process = ServiceProcess(
            name,
            argv,
            address,
            self.log_dir / f"{name}.log",
            env,
            metrics_url,
            None if self.config.credentials is None else self.config.credentials.channel_security(role),
        )
        logger.info(
            "started %s (pid %d%s), logging to %s",
            name,
            process.pid,
            f", CUDA_VISIBLE_DEVICES={devices}" if devices else "",
            process.log_path,
        )
        return process

    def _stop_processes(self, processes: Sequence[ServiceProcess]) -> None:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            code = process.wait_or_kill(self.config.stop_timeout_s)
            logger.info("%s exited with code %s", process.name, code)

    def _owned_redis(self) -> RedisServer:
        if self.redis is None:
            raise RuntimeError("the cluster uses an external Redis (redis_url); it cannot stop or start it")
        return self.redis

    @staticmethod
    def _run(coro: Coroutine[Any, Any, T]) -> T:
        # NOTE: a fresh loop on a worker thread, so callers inside a running event loop can block on it too.
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pdserve-cluster") as pool:
            return pool.submit(asyncio.run, coro).result()
