"""The router's admission (router.admission.admission) with `--workers N`: two admissions over two rows of one counts
table stand for two router processes (the table itself is tested across real processes in test_shared_counts.py). A call
admitted in one counts against the limits in the other (calls and prompt tokens in flight, calls queued, a client's
streams), the drain rate is both's, a waiter in one goes when room returns in the other, and a dead process's row
counts no more once the supervisor clears it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from common.errors import ResourceExhaustedError
from router.admission.admission import RouterAdmission
from router.admission.admission_state import Stage
from router.config import RouterConfig
from router.processes.shared_counts import SharedCounts
from tests.router.test_admission import Clock, Pods

RECHECK_TIMEOUT_S = 10.0
"""Bound on a wake from another process's room (it comes within CROSS_PROCESS_RECHECK_S; generous for a loaded
machine)."""


class Router:
    """The supervisor's table and one admission per worker row, on one fake clock."""

    def __init__(self, path: Path, clock: Clock, pods: Pods, config: RouterConfig) -> None:
        self.table = SharedCounts.create(path, 2)
        self.rows = [SharedCounts.open(path, row) for row in range(2)]
        self.a, self.b = (RouterAdmission(config, pods, clock=clock, counts=row) for row in self.rows)

    def close(self) -> None:
        for counts in (*self.rows, self.table):
            counts.close()


@pytest.fixture
def make_router(tmp_path: Path) -> Iterator[Callable[..., Router]]:
    """`make_router(clock, pods=None, **config)`: a router of two processes, closed after the test."""
    made: list[Router] = []

    def make(clock: Clock, pods: Pods | None = None, **config: object) -> Router:
        router = Router(tmp_path / f"counts-{len(made)}", clock, pods or Pods(), RouterConfig(**config))  # type: ignore[arg-type]
        made.append(router)
        return router

    yield make
    for router in made:
        router.close()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _counts(admission: RouterAdmission) -> tuple[int, int, int]:
    """(queued, in flight, prompt tokens in flight), as `admission` reads them."""
    state = admission.state
    return state.num_queued, state.num_in_flight, state.num_in_flight_tokens


def test_calls_in_flight_in_one_process_fill_the_room_of_the_other(make_router: Callable[..., Router]) -> None:
    async def main() -> None:
        clock = Clock()
        router = make_router(clock, max_waiting_requests_per_prefill_pod=2)
        a, b = router.a, router.b
        first, second = a.enter("c", None), b.enter("c", None)
        await a.admit(first, 10, clock.now, None)
        await b.admit(second, 20, clock.now, None)
        third = a.enter("c", None)
        waiting = asyncio.create_task(a.admit(third, 30, clock.now, None))
        await _settle()
        assert (_counts(a), _counts(b), a.num_waiting, b.num_waiting) == ((1, 2, 30), (1, 2, 30), 1, 0)
        assert third.stage is Stage.QUEUED  # one process alone would have had room for it
        b.start(second)  # the first token comes in B, whose queue is empty: A's re-check lets its waiter go
        await asyncio.wait_for(waiting, RECHECK_TIMEOUT_S)
        assert (third.stage, _counts(b)) == (Stage.IN_FLIGHT, (0, 2, 40))
        for admission, ticket in ((a, first), (b, second), (a, third)):
            admission.leave(ticket)
        assert (_counts(a), _counts(b)) == ((0, 0, 0), (0, 0, 0))

    asyncio.run(main())


def test_prompt_tokens_in_flight_in_one_process_hold_a_call_in_the_other(make_router: Callable[..., Router]) -> None:
    async def main() -> None:
        clock = Clock()
        router = make_router(clock, max_queued_prompt_tokens_per_prefill_pod=100)
        a, b = router.a, router.b
        long = a.enter("c", None)
        await a.admit(long, 60, clock.now, None)
        short = b.enter("c", None)
        waiting = asyncio.create_task(b.admit(short, 50, clock.now, None))  # 60 + 50 > 100
        await _settle()
        assert (short.stage, b.num_waiting) == (Stage.QUEUED, 1)
        a.leave(long)  # the call in A ended: B's waiter goes on its re-check
        await asyncio.wait_for(waiting, RECHECK_TIMEOUT_S)
        assert (_counts(a), short.stage) == ((0, 1, 50), Stage.IN_FLIGHT)

    asyncio.run(main())


def test_a_clients_streams_and_the_calls_queued_count_in_every_process(make_router: Callable[..., Router]) -> None:
    clock = Clock()
    router = make_router(clock, max_streams_per_client=2, max_queued_requests=3)
    a, b = router.a, router.b
    alice = [a.enter("alice", None), b.enter("alice", None)]
    for admission in (a, b):
        with pytest.raises(ResourceExhaustedError) as refused:
            admission.enter("alice", None)
        assert str(refused.value) == "overloaded: client 'alice' has 2 streams open (limit 2)"
    b.leave(alice[1])
    alice.append(a.enter("alice", None))  # the stream that left B makes room in A
    assert (a.state.num_streams("alice"), b.state.num_streams("alice")) == (2, 2)
    b.enter("bob", None)
    with pytest.raises(ResourceExhaustedError) as refused:
        b.enter("carol", None)
    assert str(refused.value) == "overloaded: 3 requests queued in the router (limit 3)"


def test_the_drain_rate_and_the_predicted_wait_are_the_whole_routers(make_router: Callable[..., Router]) -> None:
    async def main() -> None:
        clock = Clock()
        router = make_router(clock, max_waiting_requests_per_prefill_pod=1)
        a, b = router.a, router.b
        for admission in (a, b, a):
            ticket = admission.enter("c", None)
            await admission.admit(ticket, 10, clock.now, None)
            clock.now += 1.0
            admission.start(ticket)  # first tokens at 101 (A), 102 (B), 103 (A)
        in_flight = b.enter("c", None)
        await b.admit(in_flight, 10, clock.now, None)
        queued = [admission.enter("c", None) for admission in (a, b, a)]
        # 3 first tokens in the 2 s since the earliest, counted in both; a new call has 1 in flight and 3 queued
        # ahead of it, and room for 1: 4 first tokens due before it, at 3 per 2 s. (Not a prediction yet: calls
        # have waited for room only now, and the rate of a window with idle time in it is no capacity.)
        assert (a.state.seconds_to_drain(4), b.state.seconds_to_drain(4)) == (8 / 3, 8 / 3)
        assert (a.predicted_wait_s(), b.predicted_wait_s()) == (None, None)
        for admission, ticket in zip((a, b, a), queued, strict=True):
            admission.leave(ticket)
        router.table.clear_row(1)  # B died: its call in flight and its first token count no more
        assert (_counts(a), a.predicted_wait_s()) == ((0, 0, 0), 0.0)
        assert a.state.seconds_to_drain(1) == 1.0  # 2 first tokens (A's) in 2 s

    asyncio.run(main())
