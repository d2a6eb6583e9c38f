"""LocalCluster's own lifecycle, over stand-in processes that serve only health (no model loads)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.cluster import LocalCluster
from cli.cluster_config import ClusterConfig, Role
from cli.service_process import ClusterError
from common.grpc.server import wait_for_health

STANDIN = str(Path(__file__).with_name("standin_service.py"))


def standin_entry_points(**overrides: tuple[str, ...]) -> dict[Role, tuple[str, ...]]:
    roles: tuple[Role, ...] = ("router", "prefill", "decode")
    return {role: (sys.executable, STANDIN, "--role", role, *overrides.get(role, ())) for role in roles}


def config(tmp_path: Path, **kwargs: object) -> ClusterConfig:
    values: dict[str, object] = {
        "num_prefill": 2,
        "num_decode": 1,
        "port": 0,
        "registry_refresh_s": 0.05,
        "stop_timeout_s": 5.0,
        "startup_timeout_s": 30.0,
        "log_dir": tmp_path,
        "entry_points": standin_entry_points(),
    }
    values.update(kwargs)
    return ClusterConfig(**values)  # type: ignore[arg-type]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(config(tmp_path)) as running:
        yield running


def serving(address: str) -> bool:
    try:
        asyncio.run(wait_for_health(address, 1.0))
    except TimeoutError:
        return False
    return True


def test_start_serves_and_registers_every_pod_then_stop_ends_everything(tmp_path: Path) -> None:
    cluster = LocalCluster(config(tmp_path))
    cluster.start()
    try:
        assert cluster.pod_ids == ["prefill-0", "prefill-1", "decode-0"]
        assert [(p.pod_id, p.role) for p in cluster.pod_infos()] == [
            ("decode-0", "decode"),
            ("prefill-0", "prefill"),
            ("prefill-1", "prefill"),
        ]
        assert serving(cluster.router_address)
        assert {p.name: p.log_path for p in cluster.pods.values()}["decode-0"] == tmp_path / "decode-0.log"
        processes = [cluster.router, *cluster.pods.values()]
        redis = cluster.redis
    finally:
        cluster.stop()
    assert [p.returncode for p in processes if p is not None] == [0, 0, 0, 0]
    assert redis is not None and not redis.running
    assert cluster.pods == {} and cluster.router is None
    cluster.stop()


def test_a_process_exiting_while_starting_stops_the_rest_and_shows_its_log(tmp_path: Path) -> None:
    entry_points = standin_entry_points(decode=("--exit-code", "3"), prefill=("--load-s", "30"))
    cluster = LocalCluster(config(tmp_path, entry_points=entry_points))
    started = time.monotonic()
    with pytest.raises(ClusterError, match=r"(?s)decode-0 exited with code 3 while starting.*failing on purpose"):
        cluster.start()
    assert time.monotonic() - started < 15
    assert cluster.pods == {} and cluster.router is None
    assert cluster.redis is not None and not cluster.redis.running


def test_add_pod_then_stop_pod_by_id_and_by_index(cluster: LocalCluster) -> None:
    assert cluster.add_pod("decode") == "decode-1"
    assert [p.pod_id for p in cluster.pod_infos()] == ["decode-0", "decode-1", "prefill-0", "prefill-1"]
    assert cluster.stop_pod("decode-1").returncode == 0
    assert cluster.stop_pod(0).returncode == 0
    assert cluster.pod_ids == ["prefill-1", "decode-0"]
    assert [p.pod_id for p in cluster.pod_infos()] == ["decode-0", "prefill-1"]


def test_drain_pod_returns_at_once_and_the_pod_is_reaped_once_it_exits(cluster: LocalCluster) -> None:
    process = cluster.drain_pod("prefill-1")
    assert cluster.pod_ids == ["prefill-0", "decode-0"] and list(cluster.draining) == ["prefill-1"]
    assert process.wait_or_kill(5.0) == 0
    assert cluster.reap_drained() == {"prefill-1": 0}
    assert cluster.draining == {}


def test_no_pod_starts_once_the_cluster_is_stopped(tmp_path: Path) -> None:
    cluster = LocalCluster(config(tmp_path))
    cluster.stop()
    with pytest.raises(ClusterError, match="the cluster is stopped"):
        cluster.add_pod("decode")
    assert cluster.pods == {}


def test_stop_pod_with_sigkill_leaves_the_registry_entry_to_its_ttl(cluster: LocalCluster) -> None:
    assert cluster.stop_pod("prefill-1", sig=signal.SIGKILL).returncode == -signal.SIGKILL
    assert "prefill-1" in [p.pod_id for p in cluster.pod_infos()]


def test_redis_restarts_on_the_same_port_and_pods_register_again(cluster: LocalCluster) -> None:
    url = cluster.redis_url
    cluster.stop_redis()
    cluster.start_redis()
    assert cluster.redis_url == url
    deadline = time.monotonic() + 5
    while len(cluster.pod_infos()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p.pod_id for p in cluster.pod_infos()] == ["decode-0", "prefill-0", "prefill-1"]


def test_cluster_methods_work_inside_a_running_event_loop(cluster: LocalCluster) -> None:
    async def inside() -> list[str]:
        return [p.pod_id for p in cluster.pod_infos()]

    assert asyncio.run(inside()) == ["decode-0", "prefill-0", "prefill-1"]


def test_cli_help_works_without_the_services() -> None:
    done = subprocess.run([sys.executable, "-m", "cli.main", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert all(name in done.stdout for name in ("up", "router", "prefill", "decode", "generate"))


def test_cli_generate_reports_an_unreachable_router_and_exits_non_zero() -> None:
    argv = [sys.executable, "-m", "cli.main", "generate", "hi", "--address", "127.0.0.1:1", "--timeout-s", "2"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "error: UNAVAILABLE" in done.stderr or "error: DEADLINE_EXCEEDED" in done.stderr
