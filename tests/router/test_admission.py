"""The router's admission (router.admission): who a client is, limits per prefill pod, and the gate's counts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from common.errors import ResourceExhaustedError, UnavailableError
from pod.admission import AdmissionLimits
from router.admission import DOOR_PASS, DRAIN_RETRY_S, RouterAdmission, client_id
from router.config import RouterConfig


def test_the_client_is_its_metadata_key_else_its_peer_host() -> None:
    assert client_id([("x-client-id", "alice"), ("other", "x")], "ipv4:127.0.0.1:5000") == "alice"
    assert client_id([("x-client-id", b"bob")], "ipv4:127.0.0.1:5000") == "bob"
    assert client_id([("x-client-id", "")], "ipv4:127.0.0.1:5000") == "ipv4:127.0.0.1"
    assert client_id([], "ipv6:[::1]:41234") == "ipv6:[::1]"
    assert client_id([], "unix:/tmp/socket") == "unix:/tmp/socket"


def test_the_queue_limits_scale_with_the_live_prefill_pods() -> None:
    num_pods = [0]
    config = RouterConfig(
        max_waiting_requests_per_prefill_pod=3,
        max_queued_prompt_tokens_per_prefill_pod=100,
        max_streams_per_client=5,
        max_retry_s=2.0,
    )
    admission = RouterAdmission(config, lambda: num_pods[0])
    assert admission.limits() == AdmissionLimits(3, 100, 5, 0.05, 2.0)
    num_pods[0] = 2
    assert admission.limits() == AdmissionLimits(6, 200, 5, 0.05, 2.0)


def test_the_queue_is_filling_from_a_quarter_of_its_places_held_or_waiting() -> None:
    num_pods = [1]
    admission = RouterAdmission(RouterConfig(max_waiting_requests_per_prefill_pod=8), lambda: num_pods[0])
    admission.enter()
    assert not admission.filling()  # 1 of 8
    admission.admission.admit("someone", 10, admission.limits())
    assert admission.filling()  # 2 of 8: one held, one waiting
    num_pods[0] = 2
    assert not admission.filling()  # 2 of 16
    assert not RouterAdmission(RouterConfig(max_waiting_requests_per_prefill_pod=0), lambda: 1).filling()  # no limit


async def _chunks(items: list[str], release: asyncio.Event) -> AsyncGenerator[str, None]:
    await release.wait()
    for item in items:
        yield item


def test_the_gate_refuses_beyond_the_limit_and_counts_until_the_first_chunk_and_the_end() -> None:
    async def main() -> None:
        admission = RouterAdmission(RouterConfig(max_waiting_requests_per_prefill_pod=1, max_retry_s=2.0), lambda: 1)
        release = asyncio.Event()
        first = admission.gate(_chunks(["a", "b"], release), "alice", 10)
        waiting = asyncio.create_task(anext(first))
        await asyncio.sleep(0)
        assert (admission.admission.num_waiting, admission.admission.num_queued_prompt_tokens) == (1, 10)
        with pytest.raises(ResourceExhaustedError) as refused:
            await anext(admission.gate(_chunks(["x"], release), "bob", 10))
        assert str(refused.value) == "overloaded: 1 requests waiting (limit 1)"
        assert refused.value.retry_after_s == 2.0
        release.set()
        assert await waiting == "a"
        assert (admission.admission.num_waiting, admission.admission.num_streams("alice")) == (0, 1)
        await first.aclose()
        assert admission.admission.num_streams("alice") == 0
        assert [chunk async for chunk in admission.gate(_chunks(["c"], release), "bob", 4)] == ["c"]
        assert admission.admission.num_streams("bob") == 0

    asyncio.run(main())


def test_the_door_is_closed_while_draining_or_full_and_the_client_limit_needs_a_client() -> None:
    draining = [False]
    config = RouterConfig(max_waiting_requests_per_prefill_pod=2, max_streams_per_client=1, max_retry_s=2.0)
    admission = RouterAdmission(config, lambda: 1, lambda: draining[0])
    ticket = admission.admission.admit("alice", 10, admission.limits())
    admission.enter().release()
    admission.check("bob")
    with pytest.raises(ResourceExhaustedError, match="client 'alice' has 1 streams open"):
        admission.check("alice")
    admission.admission.admit("bob", 10, admission.limits())
    with pytest.raises(ResourceExhaustedError, match="2 requests waiting"):
        admission.enter()
    admission.admission.finish(ticket)
    draining[0] = True
    with pytest.raises(UnavailableError, match="draining") as refused:
        admission.enter()
    assert refused.value.retry_after_s == DRAIN_RETRY_S
    with pytest.raises(UnavailableError):
        admission.check("carol")


def test_door_passes_fill_the_queue_until_their_calls_are_admitted_or_end() -> None:
    async def main() -> None:
        admission = RouterAdmission(RouterConfig(max_waiting_requests_per_prefill_pod=2), lambda: 1)
        first, second = admission.enter(), admission.enter()
        assert (admission.admission.num_held, admission.admission.num_waiting) == (2, 0)
        with pytest.raises(ResourceExhaustedError, match="2 requests waiting"):
            admission.enter()
        with pytest.raises(ResourceExhaustedError, match="2 requests waiting"):
            admission.check("http-client")  # a call without a pass (the HTTP API's) counts every held place
        DOOR_PASS.set(first)
        admission.check("alice")  # its own place is not held against it
        chunks = admission.gate(_chunks(["a"], asyncio.Event()), "alice", 10)
        waiting = asyncio.create_task(anext(chunks))
        await asyncio.sleep(0)
        assert (first.held, admission.admission.num_held, admission.admission.num_waiting) == (False, 1, 1)
        second.release()
        second.release()
        assert admission.admission.num_held == 0
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await chunks.aclose()
        assert admission.admission.num_waiting == 0

    asyncio.run(main())
