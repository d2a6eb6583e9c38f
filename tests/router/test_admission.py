"""The router's admission (router.admission.admission) on a fake clock: who a client is, the refusals at arrival and
their RetryInfo delays, calls waiting for room in flight or a live pod, the wait's bound, and waiting for room
mid-call."""

from __future__ import annotations

import asyncio

import pytest

from common.errors import ResourceExhaustedError, UnavailableError
from common.pod_registry import PodRole
from router.admission.admission import DRAIN_RETRY_S, MIN_RETRY_S, RouterAdmission, client_id
from router.admission.admission_state import Stage
from router.admission.wait_queue import WaitTimedOut
from router.config import RouterConfig


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Pods:
    """Live pods per role, as the pod view would count them."""

    def __init__(self, num_prefill: int = 1, num_decode: int = 1) -> None:
        self.live: dict[PodRole, int] = {"prefill": num_prefill, "decode": num_decode}

    def __call__(self, role: PodRole) -> int:
        return self.live[role]


def _admission(clock: Clock, pods: Pods | None = None, **config: object) -> RouterAdmission:
    return RouterAdmission(RouterConfig(**config), pods or Pods(), clock=clock)  # type: ignore[arg-type]


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _counts(admission: RouterAdmission) -> tuple[int, int, int]:
    """(queued, in flight, waiting in the queue)."""
    return admission.state.num_queued, admission.state.num_in_flight, admission.num_waiting


def test_the_client_is_its_metadata_key_else_its_peer_host() -> None:
    assert client_id([("x-client-id", "alice"), ("other", "x")], "ipv4:127.0.0.1:5000") == "alice"
    assert client_id([("x-client-id", b"bob")], "ipv4:127.0.0.1:5000") == "bob"
    assert client_id([("x-client-id", "")], "ipv4:127.0.0.1:5000") == "ipv4:127.0.0.1"
    assert client_id([], "ipv6:[::1]:41234") == "ipv6:[::1]"
    assert client_id([], "unix:/tmp/socket") == "unix:/tmp/socket"


def test_arrivals_are_refused_while_draining_over_the_client_limit_or_beyond_the_queue_bound() -> None:
    draining = [False]
    config = RouterConfig(max_streams_per_client=2, max_queued_requests=3, max_retry_s=2.0)
    admission = RouterAdmission(config, Pods(), lambda: draining[0], Clock())
    alice = [admission.enter("alice", None), admission.enter("alice", None)]
    with pytest.raises(ResourceExhaustedError) as refused:
        admission.enter("alice", None)
    assert str(refused.value) == "overloaded: client 'alice' has 2 streams open (limit 2)"
    assert refused.value.retry_after_s == MIN_RETRY_S  # room in flight: nothing to wait for
    admission.enter("bob", None)
    with pytest.raises(ResourceExhaustedError) as refused:
        admission.enter("carol", None)
    assert (str(refused.value), refused.value.retry_after_s) == (
        "overloaded: 3 requests queued in the router (limit 3)",
        MIN_RETRY_S,
    )
    admission.leave(alice[0])
    admission.leave(alice[0])  # once only
    assert (admission.state.num_queued, admission.state.num_streams("alice")) == (2, 1)
    admission.enter("carol", None)
    draining[0] = True
    with pytest.raises(UnavailableError, match="draining") as unavailable:
        admission.enter("dave", None)
    assert unavailable.value.retry_after_s == DRAIN_RETRY_S


def test_a_call_is_refused_at_once_when_the_predicted_wait_exceeds_the_bound_or_its_deadline() -> None:
    async def main() -> None:
        clock = Clock()
        admission = _admission(clock, max_waiting_requests_per_prefill_pod=2, max_queue_wait_s=10.0, max_retry_s=3.0)
        first, second = admission.enter("c", None), admission.enter("c", None)
        await admission.admit(first, 10, clock.now, None)
        await admission.admit(second, 10, clock.now, None)
        queued = [admission.enter("c", None) for _ in range(3)]
        assert admission.predicted_wait_s() is None  # full, and nothing drained yet: no rate, no refusal
        clock.now += 1.0
        admission.start(first)
        clock.now += 4.0
        admission.start(second)
        # NOTE: 2 first tokens came, but calls have waited for room only 5 s: the rate may still hold idle time.
        assert admission.predicted_wait_s() is None
        admission.enter("c", 0.5)  # not refused for its deadline either
        clock.now += 5.0
        # Backed up for a whole window: 2 first tokens in the 9 s since the first of them; 3 calls ahead of a new one.
        assert _counts(admission) == (4, 0, 0)
        assert admission.predicted_wait_s() == 13.5
        with pytest.raises(ResourceExhaustedError) as refused:
            admission.enter("c", None)
        assert (str(refused.value), refused.value.retry_after_s) == (
            "overloaded: the router's queue would take 13.5 s (bound 10 s)",
            3.0,
        )
        admission.leave(queued.pop())
        assert admission.predicted_wait_s() == 9.0  # 2 ahead: within the bound
        with pytest.raises(ResourceExhaustedError) as refused:
            admission.enter("c", 8.5)
        assert (str(refused.value), refused.value.retry_after_s) == (
            "overloaded: the router's queue would take 9.0 s, past the call's deadline in 8.5 s",
            3.0,
        )
        for ticket in queued:
            admission.leave(ticket)
        assert admission.predicted_wait_s() == 0.0  # room again: the backlog is over
        assert admission.retry_after_s() == 0.05

    asyncio.run(main())


def test_calls_beyond_the_room_in_flight_wait_in_arrival_order_and_go_as_first_tokens_come() -> None:
    async def main() -> None:
        clock = Clock()
        pods = Pods()
        admission = _admission(clock, pods, max_waiting_requests_per_prefill_pod=1)
        tickets = [admission.enter(f"c{i}", None) for i in range(3)]
        await admission.admit(tickets[0], 10, 1.0, None)
        later = asyncio.create_task(admission.admit(tickets[2], 10, 3.0, None))
        earlier = asyncio.create_task(admission.admit(tickets[1], 10, 2.0, None))
        await _settle()
        assert _counts(admission) == (2, 1, 2)
        admission.start(tickets[0])
        await earlier
        assert (tickets[1].stage, tickets[2].stage, _counts(admission)) == (Stage.IN_FLIGHT, Stage.QUEUED, (1, 1, 1))
        pods.live["prefill"] = 2  # the room in flight is per live prefill pod
        admission.on_pods_refreshed()
        await later
        assert _counts(admission) == (0, 2, 0)
        for ticket in tickets:
            admission.leave(ticket)
        assert (_counts(admission), admission.state.num_in_flight_tokens) == ((0, 0, 0), 0)

    asyncio.run(main())


def test_a_prompt_over_the_token_room_goes_alone_and_the_next_waits_for_its_first_token() -> None:
    async def main() -> None:
        clock = Clock()
        admission = _admission(clock, max_queued_prompt_tokens_per_prefill_pod=100)
        long, short = admission.enter("c", None), admission.enter("c", None)
        await admission.admit(long, 150, clock.now, None)
        waiting = asyncio.create_task(admission.admit(short, 10, clock.now, None))
        await _settle()
        assert (admission.state.num_in_flight_tokens, waiting.done()) == (150, False)
        admission.start(long)
        await waiting
        assert admission.state.num_in_flight_tokens == 10

    asyncio.run(main())


def test_with_no_live_pod_a_call_waits_for_one_and_its_wait_is_bounded() -> None:
    async def main() -> None:
        clock = Clock()
        pods = Pods(num_prefill=0, num_decode=0)
        admission = _admission(clock, pods, max_queue_wait_s=30.0, max_retry_s=4.0)
        ticket = admission.enter("c", None)
        waiting = asyncio.create_task(admission.admit(ticket, 10, clock.now, None))
        await _settle()
        pods.live["prefill"] = 1
        admission.on_pods_refreshed()
        await _settle()
        assert (waiting.done(), admission.predicted_wait_s()) == (False, None)  # no decode pod yet
        pods.live["decode"] = 1
        admission.on_pods_refreshed()
        await waiting
        assert ticket.stage is Stage.IN_FLIGHT

        pods.live["decode"] = 0
        late = admission.enter("c", None)
        waiting = asyncio.create_task(admission.admit(late, 10, clock.now, clock.now + 60.0))
        await _settle()
        clock.now += 30.0  # the bound comes before the call's own deadline
        admission.on_pods_refreshed()
        with pytest.raises(UnavailableError) as unavailable:
            await waiting
        assert (str(unavailable.value), unavailable.value.retry_after_s) == (
            "no decode pod is available (waited 30.0 s)",
            4.0,
        )
        assert _counts(admission) == (1, 1, 0)  # its ticket stays queued until the call leaves

    asyncio.run(main())


def test_a_call_that_waits_past_its_bound_or_deadline_is_resource_exhausted_with_the_predicted_wait() -> None:
    async def main() -> None:
        clock = Clock()
        admission = _admission(clock, max_waiting_requests_per_prefill_pod=1, max_queue_wait_s=30.0)
        first = admission.enter("c", None)
        await admission.admit(first, 10, clock.now, None)
        waiting = asyncio.create_task(admission.admit(admission.enter("c", None), 10, clock.now, clock.now + 5.0))
        await _settle()
        clock.now += 5.0  # its own deadline, before the bound
        admission.on_pods_refreshed()
        with pytest.raises(ResourceExhaustedError) as refused:
            await waiting
        assert (str(refused.value), refused.value.retry_after_s) == (
            "overloaded: waited 5.0 s in the router's queue (bound 30 s)",
            5.0,  # nothing drained yet: max_retry_s
        )

    asyncio.run(main())


def test_a_cancelled_call_leaves_the_queue_and_its_ticket_gives_everything_back() -> None:
    async def main() -> None:
        clock = Clock()
        admission = _admission(clock, max_waiting_requests_per_prefill_pod=1)
        first, second = admission.enter("c", None), admission.enter("c", None)
        await admission.admit(first, 10, clock.now, None)
        waiting = asyncio.create_task(admission.admit(second, 10, clock.now, None))
        await _settle()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        admission.leave(second)
        admission.leave(first)
        assert (_counts(admission), admission.state.num_streams("c")) == ((0, 0, 0), 0)

    asyncio.run(main())


def test_a_completion_waiting_for_room_goes_ahead_of_later_calls_after_the_next_capacity_event() -> None:
    async def main() -> None:
        clock = Clock()
        admission = _admission(clock, max_waiting_requests_per_prefill_pod=2)
        sent = admission.enter("c", None)
        await admission.admit(sent, 10, 1.0, None)
        room = [True]
        kv_waiter = asyncio.create_task(admission.wait_for_room(1.0, None, lambda: room[0]))
        await _settle()
        assert not kv_waiter.done()  # room in the view, but no event since it found every decode pod full
        newcomer = admission.enter("c", None)
        queued = asyncio.create_task(admission.admit(newcomer, 10, 2.0, None))
        await _settle()
        assert (queued.done(), admission.num_waiting) == (False, 2)  # behind the earlier call's completion
        room[0] = False
        admission.on_pods_refreshed()
        await _settle()
        assert (kv_waiter.done(), queued.done()) == (False, False)
        room[0] = True
        admission.leave(sent)  # a call of this router ended
        await kv_waiter
        await queued
        deadline_passed = asyncio.create_task(admission.wait_for_room(3.0, clock.now + 1.0, lambda: True))
        await _settle()
        clock.now += 1.0
        admission.on_pods_refreshed()  # NOTE: the deadline comes first: expired before the event lets it go
        with pytest.raises(WaitTimedOut):
            await deadline_passed

    asyncio.run(main())
