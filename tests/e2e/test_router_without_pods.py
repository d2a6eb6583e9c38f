"""A router started before any pod (real processes: Redis, the router, then a prefill and a decode pod): its health
says NOT_SERVING (grpc.health.v1, HTTP /health 503) while no live prefill and decode pod is registered, a Generate
call sent meanwhile waits in its queue, and once the pods are up the call is served and health says SERVING."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from cli.health import check_health
from cli.ports import free_port
from cli.redis_server import RedisServer
from cli.service_process import ServiceProcess
from client.generation_client import build_request
from engine.config import DEFAULT_MODEL
from pdserve.v1 import generation_pb2, generation_pb2_grpc
from tests.e2e.support import POD_ARGS, REGISTRY_REFRESH_S, STARTUP_TIMEOUT_S, wait_until

pytestmark = pytest.mark.slow


class _Processes:
    """Service processes on free ports against one Redis, logging under `log_dir`; stopped in reverse order."""

    def __init__(self, redis_url: str, log_dir: Path) -> None:
        self._redis_url = redis_url
        self._log_dir = log_dir
        self.started: list[ServiceProcess] = []

    def start(self, name: str, module: str, *args: str) -> ServiceProcess:
        port = free_port()
        argv = [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--redis-url", self._redis_url, "--model", DEFAULT_MODEL, *args]
        process = ServiceProcess(name, argv, f"127.0.0.1:{port}", self._log_dir / f"{name}.log", dict(os.environ))
        self.started.append(process)
        return process

    def stop(self) -> None:
        for process in reversed(self.started):
            process.send_signal(signal.SIGTERM)
        for process in reversed(self.started):
            process.wait_or_kill(30.0)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.log_tail()}" for p in self.started)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[_Processes]:
    with RedisServer() as redis:
        started = _Processes(redis.url, tmp_path)
        try:
            yield started
        finally:
            started.stop()


def _health(address: str) -> str:
    return asyncio.run(check_health(address, timeout_s=5.0)).status


def test_health_is_not_serving_until_pods_come_and_a_call_sent_meanwhile_is_served(processes: _Processes) -> None:
    http_port = free_port()
    # NOTE: the call waits while the pods load the model, longer than the default bound on a loaded machine.
    router_args = {
        "--registry-refresh-s": REGISTRY_REFRESH_S,
        "--http-port": http_port,
        "--max-queue-wait-s": STARTUP_TIMEOUT_S,
    }
    router = processes.start("router", "router", *(str(part) for item in router_args.items() for part in item))
    assert wait_until(lambda: _health(router.address) == "NOT_SERVING", STARTUP_TIMEOUT_S), processes.logs()
    health = httpx.get(f"http://127.0.0.1:{http_port}/health", timeout=5.0)
    assert (health.status_code, health.json()) == (
        503,
        {"status": "no pods", "num_prefill_pods": 0, "num_decode_pods": 0},
    )

    request = build_request("The three primary colors are", max_tokens=4, ignore_eos=True, temperature=0.0)
    with grpc.insecure_channel(router.address) as channel, concurrent.futures.ThreadPoolExecutor(1) as pool:
        stub = generation_pb2_grpc.GenerationServiceStub(channel)

        def generate() -> list[int]:
            return [t for r in stub.Generate(request, timeout=STARTUP_TIMEOUT_S) for t in r.token_ids]

        def num_running() -> int:
            return stub.GetLoad(generation_pb2.GetLoadRequest(), timeout=5.0).num_running_requests

        call = pool.submit(generate)
        assert wait_until(lambda: num_running() == 1, 30.0), processes.logs()  # in the router, waiting for pods
        pods = [
            processes.start(name, f"{name.split('-')[0]}_service", "--pod-id", name, *POD_ARGS)
            for name in ("prefill-0", "decode-0")
        ]
        for pod in pods:
            asyncio.run(pod.wait_serving(STARTUP_TIMEOUT_S))
        assert wait_until(lambda: _health(router.address) == "SERVING", 10.0), processes.logs()
        assert len(call.result(timeout=60.0)) == 4, processes.logs()
    assert httpx.get(f"http://127.0.0.1:{http_port}/health", timeout=5.0).json() == {"status": "serving"}
