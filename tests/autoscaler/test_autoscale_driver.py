"""The autoscaler's driver over a fake registry and a fake connector: exact connector calls per tick; the choice
of the pod to drain; the local and kubernetes connectors; the CLI's refusals."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future

import pytest
from prometheus_client import CollectorRegistry

from autoscaler.config import AutoscalerConfig
from autoscaler.connector import KubernetesConnector, pod_to_drain
from autoscaler.driver import AutoscaleDriver
from autoscaler.local_connector import LocalConnector
from autoscaler.metrics import AutoscalerMetrics
from autoscaler.planner import Decision
from cli.main import main
from common.errors import UnavailableError
from common.pod_registry import PodInfo, PodRole
from common.redis_client import redact

CONFIG = AutoscalerConfig(
    min_prefill=1,
    max_prefill=3,
    min_decode=1,
    max_decode=3,
    autoscale_interval_s=0.01,
    scale_down_window_s=20.0,
    action_timeout_s=60.0,
    prefill_waiting_high=4.0,
    prefill_waiting_low=1.0,
)
DECISIONS = "pdserve:autoscaler_scaling_decisions_total"


def pod(pod_id: str, waiting: int = 0, running: int = 0, free: int = 100, draining: bool = False) -> PodInfo:
    role: PodRole = "prefill" if pod_id.startswith("prefill") else "decode"
    return PodInfo(
        pod_id,
        role,
        f"{pod_id}:1",
        "m",
        1,
        draining=draining,
        num_running=running,
        num_waiting=waiting,
        num_free_blocks=free,
        num_total_blocks=100,
    )


class FakeRegistry:
    """`list_pods` returns the next scripted listing (an exception is raised)."""

    def __init__(self, *listings: list[PodInfo] | Exception) -> None:
        self._listings = list(listings)

    async def list_pods(self) -> list[PodInfo]:
        listing = self._listings.pop(0)
        if isinstance(listing, Exception):
            raise listing
        return listing


class FakeConnector:
    def __init__(self, pending: Sequence[frozenset[PodRole]] = ()) -> None:
        self.calls: list[tuple[str, str, int, list[str]]] = []
        self._pending = list(pending)
        self.closed = False

    def pending(self) -> frozenset[PodRole]:
        return self._pending.pop(0) if self._pending else frozenset()

    def scale(self, decision: Decision, pods: Sequence[PodInfo]) -> None:
        self.calls.append((decision.role, decision.direction, decision.desired, [p.pod_id for p in pods]))

    def close(self) -> None:
        self.closed = True


class Clock:
    def __init__(self, step_s: float) -> None:
        self.now_s = -step_s
        self._step_s = step_s

    def __call__(self) -> float:
        self.now_s += self._step_s
        return self.now_s


def driver(registry: FakeRegistry, connector: FakeConnector, step_s: float = 10.0) -> AutoscaleDriver:
    metrics = AutoscalerMetrics(CollectorRegistry())
    return AutoscaleDriver(CONFIG, registry.list_pods, connector, metrics, clock=Clock(step_s))


def ticks(d: AutoscaleDriver, count: int) -> list[tuple[str, str] | None]:
    async def go() -> list[tuple[str, str] | None]:
        out: list[tuple[str, str] | None] = []
        for _ in range(count):
            decisions = await d.tick()
            out.append(None if decisions is None else (decisions[0].direction, decisions[1].direction))
        return out

    return asyncio.run(go())


def test_an_overloaded_role_is_scaled_out_once_and_held_until_the_new_pod_registers() -> None:
    busy = [pod("decode-0"), pod("prefill-0", waiting=10)]
    joined = [pod("decode-0"), pod("prefill-0", waiting=5), pod("prefill-1", waiting=5)]
    connector = FakeConnector()
    d = driver(FakeRegistry(busy, busy, joined), connector)
    assert ticks(d, 3) == [("up", "hold"), ("hold", "hold"), ("up", "hold")]
    assert connector.calls == [
        ("prefill", "up", 2, ["decode-0", "prefill-0"]),
        ("prefill", "up", 3, ["decode-0", "prefill-0", "prefill-1"]),
    ]


def test_a_role_the_connector_reports_pending_is_held() -> None:
    busy = [pod("decode-0"), pod("prefill-0", waiting=10)]
    connector = FakeConnector(pending=[frozenset({"prefill"}), frozenset()])
    d = driver(FakeRegistry(busy, busy), connector)
    assert ticks(d, 2) == [("hold", "hold"), ("up", "hold")]
    assert connector.calls == [("prefill", "up", 2, ["decode-0", "prefill-0"])]


def test_an_idle_role_is_scaled_in_after_the_window_and_a_registry_outage_skips_a_round() -> None:
    idle = [pod("decode-0"), pod("decode-1"), pod("prefill-0")]
    drained = [pod("decode-0"), pod("decode-1", draining=True), pod("prefill-0")]
    connector = FakeConnector()
    registry = FakeRegistry(idle, UnavailableError("down"), idle, idle, drained)
    d = driver(registry, connector)
    assert ticks(d, 5) == [("hold", "hold"), None, ("hold", "hold"), ("hold", "down"), ("hold", "hold")]
    assert connector.calls == [("decode", "down", 1, ["decode-0", "decode-1", "prefill-0"])]


def test_every_decision_is_counted() -> None:
    metrics = AutoscalerMetrics(CollectorRegistry())
    listing = [pod("decode-0"), pod("prefill-0", waiting=10)]
    d = AutoscaleDriver(CONFIG, FakeRegistry(listing).list_pods, FakeConnector(), metrics, clock=Clock(1.0))
    ticks(d, 1)
    assert metrics.registry.get_sample_value(DECISIONS, {"role": "prefill", "direction": "up"}) == 1
    assert metrics.registry.get_sample_value(DECISIONS, {"role": "decode", "direction": "hold"}) == 1


def test_run_ticks_until_stopped_then_closes_the_connector() -> None:
    listing = [pod("decode-0"), pod("prefill-0")]
    registry = FakeRegistry(*([listing] * 1000))
    connector = FakeConnector()
    d = driver(registry, connector)
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    started = time.monotonic()
    asyncio.run(d.run(stop))
    assert time.monotonic() - started < 2.0
    assert connector.closed and connector.calls == []
    assert len(registry._listings) < 1000


def test_the_pod_to_drain_is_the_least_loaded_active_one_and_the_last_id_among_equals() -> None:
    pods = [pod("decode-0", running=1), pod("decode-1"), pod("decode-2"), pod("decode-3", draining=True)]
    assert pod_to_drain("decode", pods) == pods[2]
    assert pod_to_drain("decode", [*pods[:2], pod("decode-2", free=50)]) == pods[1]
    assert pod_to_drain("prefill", pods) is None
    assert pod_to_drain("decode", [pods[3]]) is None


def up(role: PodRole, desired: int) -> Decision:
    return Decision(role, desired - 1, desired, "up", "test")


def down(role: PodRole, desired: int) -> Decision:
    return Decision(role, desired + 1, desired, "down", "test")


class FakeCluster:
    def __init__(self, *pod_ids: str) -> None:
        self.pods: dict[str, object] = dict.fromkeys(pod_ids)
        self.adding: Future[str] = Future()
        self.calls: list[tuple[str, str]] = []

    def add_pod(self, role: PodRole) -> str:
        self.calls.append(("add_pod", role))
        return self.adding.result(timeout=5)

    def drain_pod(self, pod_id: str) -> object:
        self.calls.append(("drain_pod", pod_id))
        return self.pods.pop(pod_id)

    def wait_for_free_gpu(self, timeout_s: float) -> bool:
        self.calls.append(("wait_for_free_gpu", str(timeout_s)))
        return True


def test_the_local_connector_adds_a_pod_in_the_background_and_reports_the_role_pending() -> None:
    cluster = FakeCluster("prefill-0")
    connector = LocalConnector(cluster, gpu_wait_s=7.0)
    connector.scale(up("prefill", 2), [pod("prefill-0")])
    assert connector.pending() == frozenset({"prefill"})
    cluster.adding.set_result("prefill-1")
    deadline = time.monotonic() + 5
    while connector.pending() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert connector.pending() == frozenset()
    assert cluster.calls == [("wait_for_free_gpu", "7.0"), ("add_pod", "prefill")]
    connector.close()


def test_the_local_connector_drains_the_least_loaded_pod_of_its_cluster_only() -> None:
    cluster = FakeCluster("decode-0", "decode-1")
    connector = LocalConnector(cluster)
    registry = [pod("decode-0"), pod("decode-1", running=3), pod("decode-9")]
    connector.scale(down("decode", 1), registry)  # decode-9 is not this cluster's: nothing to drain
    connector.scale(down("decode", 1), registry[:2])
    assert cluster.calls == [("drain_pod", "decode-0")]
    assert connector.pending() == frozenset()
    connector.close()


def test_the_kubernetes_connector_publishes_the_target_of_each_change() -> None:
    registry = CollectorRegistry()
    connector = KubernetesConnector(registry)
    target = "pdserve:autoscaler_target_replicas"
    assert registry.get_sample_value(target, {"role": "decode"}) is None
    connector.scale(up("decode", 3), [])
    connector.scale(down("prefill", 1), [])
    assert registry.get_sample_value(target, {"role": "decode"}) == 3
    assert registry.get_sample_value(target, {"role": "prefill"}) == 1
    assert connector.pending() == frozenset()


def test_pdserve_autoscale_refuses_the_local_connector(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["autoscale", "--redis-url", "redis://127.0.0.1:1", "--connector", "local"]) == 2
    assert "run `pdserve up --autoscale` instead" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["autoscale", "--redis-url", "redis://127.0.0.1:1"], ["up", "--autoscale"]])
def test_bad_autoscaler_settings_are_refused_before_anything_starts(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, "--min-prefill", "3", "--max-prefill", "2"]) == 2
    assert "--max-prefill: must be >= min_prefill (3), got 2" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("url", "logged"),
    [
        ("redis://:s3cret@redis:6379/0", "redis://:***@redis:6379/0"),
        ("rediss://user:s3cret@10.0.0.7/2", "rediss://user:***@10.0.0.7/2"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ],
)
def test_the_logged_registry_url_masks_the_password(url: str, logged: str) -> None:
    assert redact(url) == logged
