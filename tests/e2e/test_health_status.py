"""`pdserve health` and `pdserve status` as subprocesses: against the session cluster (real pods and router), a
stand-in server that never turns SERVING, a dead port, and a Redis holding registry entries written here."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.cluster import LocalCluster
from cli.health import check_health
from cli.ports import free_port
from cli.redis_server import RedisServer
from common.child_process import popen_child
from common.pod_registry import PodInfo, PodRegistry
from tests.e2e.support import up_env, wait_until

_SCRIPT = Path(sys.executable).with_name("pdserve")
PDSERVE = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "cli.main"]
STANDIN = str(Path(__file__).with_name("standin_service.py"))
DEAD_PORT_BOUND_S = 10.0
"""A refused connection answers at once; the bound covers the CLI's start on a busy 2-core machine."""


def pdserve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PDSERVE, *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def loading_server() -> Iterator[str]:
    """A stand-in router that serves grpc.health.v1 but stays NOT_SERVING (it "loads" for a minute)."""
    address = f"127.0.0.1:{free_port()}"
    argv = [
        sys.executable,
        STANDIN,
        "--role",
        "router",
        "--port",
        address.rpartition(":")[2],
        "--load-s",
        "60",
        "--redis-url",
        "redis://127.0.0.1:1/0",
    ]
    process = popen_child(argv, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert wait_until(lambda: asyncio.run(check_health(address, timeout_s=1.0)).status == "NOT_SERVING", 30.0)
        yield address
    finally:
        process.terminate()
        process.wait(10)


def test_health_exits_0_on_the_serving_router_and_pod(cluster: LocalCluster) -> None:
    router = pdserve("health", cluster.router_address)
    assert (router.returncode, router.stdout) == (0, f"{cluster.router_address}: SERVING\n")
    pod = cluster.pods[cluster.pod_ids[0]]
    service = "pdserve.v1.PrefillService" if pod.name.startswith("prefill") else "pdserve.v1.DecodeService"
    checked = pdserve("health", pod.address, "--service", service)
    assert (checked.returncode, checked.stdout) == (0, f"{pod.address} {service}: SERVING\n")


def test_health_exits_1_on_an_unknown_service_a_loading_server_and_a_dead_port(
    cluster: LocalCluster, loading_server: str
) -> None:
    unknown = pdserve("health", cluster.router_address, "--service", "no.such.Service")
    assert (unknown.returncode, unknown.stderr) == (
        1,
        f"{cluster.router_address} no.such.Service: SERVICE_UNKNOWN (NOT_FOUND)\n",
    )
    loading = pdserve("health", loading_server)
    assert (loading.returncode, loading.stderr) == (1, f"{loading_server}: NOT_SERVING\n")
    dead = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    refused = pdserve("health", dead, "--timeout-s", "5")
    assert time.monotonic() - started < DEAD_PORT_BOUND_S
    assert refused.returncode == 1
    assert refused.stderr.startswith(f"{dead}: UNREACHABLE (UNAVAILABLE: "), refused.stderr


def test_status_json_lists_the_cluster_pods_serving_and_the_router(cluster: LocalCluster) -> None:
    shown = pdserve("status", "--redis-url", cluster.redis_url, "--router", cluster.router_address, "--json")
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert [(p["pod_id"], p["address"], p["state"]) for p in status["pods"]] == [
        (pod_id, cluster.pods[pod_id].address, "serving") for pod_id in sorted(cluster.pod_ids)
    ]
    assert {(p["model"], p["num_total_blocks"]) for p in status["pods"]} == {(cluster.config.model, 512)}
    assert status["routers"] == [{"address": cluster.router_address, "state": "serving"}]


def test_status_shows_registry_entries_exactly_and_a_draining_pod() -> None:
    decode = PodInfo(
        "decode-0",
        "decode",
        "10.0.0.7:40001",
        "smollm2-135m",
        17,
        num_running=2,
        num_waiting=1,
        num_free_blocks=384,
        num_total_blocks=512,
    )
    prefill = PodInfo(
        "prefill-0",
        "prefill",
        "10.0.0.8:40003",
        "smollm2-135m",
        18,
        draining=True,
        num_free_blocks=512,
        num_total_blocks=512,
    )
    dead_router = f"127.0.0.1:{free_port()}"
    with RedisServer() as redis:
        asyncio.run(_register(redis.url, [decode, prefill]))
        table = pdserve("status", "--redis-url", redis.url, "--router", dead_router)
        shown = pdserve("status", "--redis-url", redis.url, "--json")
    assert (table.returncode, table.stdout.splitlines()) == (
        0,
        [
            "POD        ROLE     STATE     ADDRESS         RUNNING  WAITING  FREE/TOTAL BLOCKS  KV USED",
            "decode-0   decode   serving   10.0.0.7:40001        2        1            384/512    25.0%",
            "prefill-0  prefill  draining  10.0.0.8:40003        0        0            512/512     0.0%",
            "",
            f"{'ROUTER':<{len(dead_router)}}  STATE",
            f"{dead_router}  unreachable",
        ],
    )
    assert shown.returncode == 0
    assert [(p["pod_id"], p["state"], p["kv_usage"]) for p in json.loads(shown.stdout)["pods"]] == [
        ("decode-0", "serving", 0.25),
        ("prefill-0", "draining", 0.0),
    ]


def test_status_without_flags_says_that_no_pdserve_up_cluster_runs(tmp_path: Path) -> None:
    # NOTE: a note left by a `pdserve up` killed with SIGKILL (unlocked) counts as none, and goes.
    (tmp_path / "pdserve" / "clusters").mkdir(parents=True)
    left_over = tmp_path / "pdserve" / "clusters" / "7.json"
    left_over.write_text(json.dumps({"pid": 7, "router_address": "127.0.0.1:1", "redis_url": "redis://127.0.0.1:1/0"}))
    shown = subprocess.run([*PDSERVE, "status"], capture_output=True, text=True, timeout=60, env=up_env(tmp_path))
    message = (
        "pdserve status: no `pdserve up` cluster is running on this machine; start one, or name a cluster's Redis "
        "with --redis-url URL (or PDSERVE_REDIS_URL)\n"
    )
    assert (shown.returncode, shown.stdout, shown.stderr) == (1, "", message)
    assert not left_over.exists()


def test_status_reports_an_unreachable_redis_and_exits_1() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    shown = pdserve("status", "--redis-url", url)
    assert shown.returncode == 1
    assert shown.stderr.startswith("pdserve status: pod registry: Redis unavailable: "), shown.stderr


async def _register(redis_url: str, pods: list[PodInfo]) -> None:
    registry = PodRegistry(redis_url, ttl_s=60.0)
    try:
        for pod in pods:
            await registry.register(pod)
    finally:
        await registry.aclose()
