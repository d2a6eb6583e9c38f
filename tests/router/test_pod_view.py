"""PodView over a real Redis registry: refresh, outages, restarts, draining, model mismatch, suspects."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc.aio
import pytest

from cli.redis_server import RedisServer
from common.errors import UnavailableError
from common.grpc.server import add_standard_services
from common.pod_registry import PodInfo, PodRegistry, PodRole
from router.pods.local_load import LocalLoads
from router.pods.pod_view import PodView

pytestmark = pytest.mark.anyio

MODEL = "smollm2-135m"
P0 = PodInfo(pod_id="prefill-0", role="prefill", address="127.0.0.1:1", model=MODEL, generation=1)
D0 = PodInfo(
    pod_id="decode-0",
    role="decode",
    address="127.0.0.1:2",
    model=MODEL,
    generation=1,
    kv_endpoint="127.0.0.1:3",
    num_free_blocks=10,
    num_total_blocks=20,
)
P1 = PodInfo(pod_id="prefill-1", role="prefill", address="127.0.0.1:4", model=MODEL, generation=7)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_keeps_the_last_list_while_redis_is_down_and_sees_new_pods_after_restart(
    redis_server: RedisServer,
) -> None:
    # NOTE: short timeouts so each failed read costs little; the router's defaults are the registry's.
    registry = PodRegistry(redis_server.url, ttl_s=30.0, timeout_s=0.2)
    view = PodView(registry, MODEL, refresh_s=60.0, load=LocalLoads())
    try:
        await registry.register(P0)
        await registry.register(D0)
        assert await view.refresh()
        assert view.pods("prefill") == [P0]
        assert view.pods("decode") == [D0]

        redis_server.stop()
        assert not await view.refresh()
        assert view.pods("prefill") == [P0]
        assert view.pods("decode") == [D0]

        redis_server.start()  # empty: nothing is persisted
        await registry.register(P1)
        assert await view.refresh()
        # NOTE: the pods missing from the restarted registry stay until their next heartbeat or one TTL.
        assert view.pods("prefill") == [P0, P1]
        assert view.pods("decode") == [D0]
    finally:
        await view.aclose()
        await registry.aclose()


async def test_draining_and_other_model_pods_take_no_new_requests(redis_server: RedisServer) -> None:
    registry = PodRegistry(redis_server.url)
    view = PodView(registry, MODEL, refresh_s=60.0, load=LocalLoads())
    try:
        await registry.register(dataclasses.replace(P0, draining=True))
        await registry.register(dataclasses.replace(P1, model="another-model"))
        await registry.register(D0)
        assert await view.refresh()
        assert view.pods("prefill") == []
        assert [pod.pod_id for pod in view.all_pods] == ["decode-0", "prefill-0"]
        await registry.register(P0)
        assert await view.refresh()
        assert view.pods("prefill") == [P0]
    finally:
        await view.aclose()
        await registry.aclose()


async def test_a_failed_pod_is_suspect_until_it_answers_health_or_restarts(redis_server: RedisServer) -> None:
    registry = PodRegistry(redis_server.url)
    clock = _Clock()
    view = PodView(registry, MODEL, refresh_s=60.0, load=LocalLoads(), cooldown_s=5.0, clock=clock)
    health_server = grpc.aio.server()
    health_state = add_standard_services(health_server, [])
    port = health_server.add_insecure_port("127.0.0.1:0")
    await health_server.start()
    answering = dataclasses.replace(P1, address=f"127.0.0.1:{port}")
    try:
        await registry.register(P0)
        await registry.register(answering)
        assert await view.refresh()
        view.report_unavailable("prefill-0")
        view.report_unavailable("prefill-1")
        # NOTE: every pod of the role suspect: they are all offered rather than none.
        assert view.pods("prefill") == [P0, answering]
        clock.now += 4.9
        await health_state.set_serving()
        assert await view.refresh()
        assert view.pods("prefill") == [P0, answering]
        clock.now += 0.1
        assert await view.refresh()
        # NOTE: prefill-1 answers SERVING; prefill-0 (nothing listens at its address) stays suspect.
        assert view.pods("prefill") == [answering]
        clock.now += 100.0
        assert await view.refresh()
        assert view.pods("prefill") == [answering]
        restarted = dataclasses.replace(P0, generation=2)
        await registry.register(restarted)
        assert await view.refresh()
        assert view.pods("prefill") == [restarted, answering]
    finally:
        await health_server.stop(None)
        await view.aclose()
        await registry.aclose()


async def test_one_client_per_pod_replaced_when_the_pod_moves(redis_server: RedisServer) -> None:
    registry = PodRegistry(redis_server.url)
    view = PodView(registry, MODEL, refresh_s=60.0, load=LocalLoads())
    try:
        client = view.client(P0)
        assert view.client(P0) is client
        assert (client.pod_id, client.address) == ("prefill-0", "127.0.0.1:1")
        moved = view.client(dataclasses.replace(P0, address="127.0.0.1:9", generation=2))
        assert moved is not client
        assert moved.address == "127.0.0.1:9"
    finally:
        await view.aclose()
        await registry.aclose()


async def test_background_refresh_picks_up_a_new_pod(redis_server: RedisServer) -> None:
    registry = PodRegistry(redis_server.url)
    view = PodView(registry, MODEL, refresh_s=0.05, load=LocalLoads())
    try:
        await view.start()
        assert view.pods("prefill") == []
        await registry.register(P0)
        for _ in range(100):
            if view.pods("prefill"):
                break
            await asyncio.sleep(0.02)
        assert view.pods("prefill") == [P0]
    finally:
        await view.aclose()
        await registry.aclose()


class _FakeRegistry:
    """A registry whose listing the test sets; `None` raises UnavailableError (Redis down)."""

    def __init__(self) -> None:
        self.listed: list[PodInfo] | None = []

    async def list_pods(self, role: PodRole | None = None) -> list[PodInfo]:
        if self.listed is None:
            raise UnavailableError("redis down")
        return sorted(self.listed, key=lambda pod: pod.pod_id)


def _grace_view(registry: _FakeRegistry, clock: _Clock) -> PodView:
    return PodView(registry, MODEL, refresh_s=60.0, load=LocalLoads(), missing_grace_s=3.0, clock=clock)


async def test_a_pod_missing_from_a_restarted_registry_stays_for_one_ttl() -> None:
    registry, clock = _FakeRegistry(), _Clock()
    view = _grace_view(registry, clock)
    registry.listed = [P0, D0]
    assert await view.refresh()
    registry.listed = None
    clock.now += 10.0
    assert not await view.refresh()
    registry.listed = []  # Redis is back, empty, before the pods' next heartbeat
    assert await view.refresh()
    assert (view.pods("prefill"), view.pods("decode")) == ([P0], [D0])
    clock.now += 2.9
    registry.listed = [D0]  # the decode pod heartbeated again
    assert await view.refresh()
    assert (view.pods("prefill"), view.pods("decode")) == ([P0], [D0])
    clock.now += 0.1
    assert await view.refresh()
    assert (view.pods("prefill"), view.pods("decode")) == ([], [D0])
    registry.listed = [D0, P0]
    assert await view.refresh()
    assert view.pods("prefill") == [P0]
    clock.now += 2.0
    registry.listed = [D0]  # missing again: a fresh grace, not what is left of the first one
    assert await view.refresh()
    clock.now += 2.9
    assert await view.refresh()
    assert view.pods("prefill") == [P0]
    clock.now += 0.1
    assert await view.refresh()
    assert view.pods("prefill") == []
    await view.aclose()


async def test_a_draining_pod_that_deregisters_drops_out_at_once() -> None:
    registry, clock = _FakeRegistry(), _Clock()
    view = _grace_view(registry, clock)
    registry.listed = [P0, P1]
    assert await view.refresh()
    registry.listed = [dataclasses.replace(P0, draining=True), P1]
    assert await view.refresh()
    assert view.pods("prefill") == [P1]
    assert [pod.pod_id for pod in view.all_pods] == ["prefill-0", "prefill-1"]
    registry.listed = [P1]
    assert await view.refresh()
    assert view.all_pods == [P1]
    await view.aclose()


async def test_a_missing_pod_leaves_when_its_address_is_taken_or_a_call_fails_or_it_returns_restarted() -> None:
    registry, clock = _FakeRegistry(), _Clock()
    view = _grace_view(registry, clock)
    registry.listed = [P0, P1, D0]
    assert await view.refresh()
    successor = dataclasses.replace(P0, pod_id="prefill-9", generation=2)
    registry.listed = [successor, D0]
    assert await view.refresh()
    assert view.pods("prefill") == [P1, successor]
    view.report_unavailable("prefill-1")
    assert view.pods("prefill") == [successor]
    assert view.all_pods == [D0, successor]
    restarted = dataclasses.replace(D0, generation=2, address="127.0.0.1:8")
    registry.listed = [successor, restarted]
    assert await view.refresh()
    assert view.pods("decode") == [restarted]
    clock.now += 100.0
    assert await view.refresh()
    assert view.all_pods == [restarted, successor]
    await view.aclose()


async def test_refresh_listeners_run_after_each_successful_read_and_one_that_fails_stops_nothing() -> None:
    registry, clock = _FakeRegistry(), _Clock()
    view = _grace_view(registry, clock)
    seen: list[list[str]] = []

    def failing() -> None:
        raise RuntimeError("listener bug")

    view.add_refresh_listener(failing)
    view.add_refresh_listener(lambda: seen.append([pod.pod_id for pod in view.all_pods]))
    registry.listed = [P0]
    assert await view.refresh()
    registry.listed = None
    assert not await view.refresh()
    registry.listed = [P0, D0]
    assert await view.refresh()
    assert seen == [["prefill-0"], ["decode-0", "prefill-0"]]
