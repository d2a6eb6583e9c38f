"""A burst at the router's door (router.door_burst): which arrivals make one, and how long the calls let in during it
wait (until the door is quiet, at most the longest deferral; a cancelled waiter leaves the others waiting)."""

from __future__ import annotations

import asyncio
import time

import pytest

from router.door_burst import DoorBurst


def test_a_burst_is_that_many_arrivals_within_the_window() -> None:
    now = [100.0]
    burst = DoorBurst(burst_calls=3, window_s=0.005, clock=lambda: now[0])
    seen = []
    for step_s in (0.0, 0.002, 0.002, 0.002, 0.010, 0.004, 0.004, 0.0005):
        now[0] += step_s
        seen.append(burst.arrived())
    # the 3rd and 4th arrivals came 4 ms after the one two before them; the 5th after a gap; the 6th and 7th
    # 14 ms and 8 ms after theirs; the 8th 4.5 ms after the 6th
    assert seen == [False, False, True, True, False, False, False, True]


@pytest.mark.anyio
async def test_a_call_let_in_during_a_burst_waits_until_the_arrivals_thin_out() -> None:
    burst = DoorBurst(burst_calls=3, window_s=0.02, quiet_s=0.3, max_defer_s=5.0)
    started = time.monotonic()
    assert (burst.arrived(), burst.arrived(), burst.arrived()) == (False, False, True)
    waiter = asyncio.create_task(burst.settled())
    for _ in range(2):
        await asyncio.sleep(0.05)
        assert burst.arrived()  # while a burst is waited out, every arrival is part of it
    await asyncio.sleep(0.1)
    assert not waiter.done()  # 0.2 s in: all 3 of the last 3 arrivals within 0.3 s
    await waiter
    assert time.monotonic() - started >= 0.3  # the first of them (at 0 s) left the window at 0.3 s
    await asyncio.sleep(0.1)
    burst.arrived()
    assert not burst.arrived()  # the burst passed: arrivals at a steady load's pace are no burst


@pytest.mark.anyio
async def test_the_wait_lasts_while_arrivals_keep_the_rate_of_a_burst() -> None:
    burst = DoorBurst(burst_calls=2, window_s=0.02, quiet_s=0.3, max_defer_s=5.0)
    burst.arrived()
    burst.arrived()
    waiter = asyncio.create_task(burst.settled())
    arrivals = []
    for _ in range(4):  # an arrival every 0.1 s: 2 within 0.3 s all along
        await asyncio.sleep(0.1)
        arrivals.append(time.monotonic())
        burst.arrived()
        assert not waiter.done()
    await waiter
    # NOTE: measured from the arrivals themselves: a loaded machine's sleeps run long, and the wait ends when the
    # second last arrival is 0.3 s old, however far apart the two last ones came.
    assert time.monotonic() - arrivals[-2] >= 0.3


@pytest.mark.anyio
async def test_a_flood_is_waited_out_at_most_max_defer() -> None:
    burst = DoorBurst(burst_calls=2, window_s=1.0, quiet_s=0.15, max_defer_s=0.2)
    burst.arrived()
    burst.arrived()
    started = time.monotonic()
    waiter = asyncio.create_task(burst.settled())
    while not waiter.done():  # an arrival every 10 ms, never a quiet 150 ms
        burst.arrived()
        await asyncio.sleep(0.01)
    waited_s = time.monotonic() - started
    assert 0.2 <= waited_s < 1.0, waited_s


@pytest.mark.anyio
async def test_a_cancelled_waiter_leaves_the_others_waiting() -> None:
    burst = DoorBurst(burst_calls=1, window_s=1.0, quiet_s=0.1, max_defer_s=5.0)
    burst.arrived()
    first, second = asyncio.create_task(burst.settled()), asyncio.create_task(burst.settled())
    await asyncio.sleep(0.01)
    first.cancel()
    await asyncio.sleep(0.01)
    assert first.cancelled() and not second.done()
    await asyncio.wait_for(second, 1.0)
