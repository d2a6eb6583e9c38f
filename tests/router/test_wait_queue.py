"""The router's wait queue (router.admission.wait_queue) on a fake clock: arrival order, the head holding the line,
deadlines, cancellation freeing a place, and a claim made for a waiter that is cancelled before it resumes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from router.admission.wait_queue import WaitQueue, WaitTimedOut


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Slots:
    """`free` places; `take` claims one, in the order of the names given."""

    def __init__(self, free: int = 0) -> None:
        self.free = free
        self.taken: list[str] = []

    def take(self, name: str) -> Callable[[], bool]:
        def take() -> bool:
            if not self.free:
                return False
            self.free -= 1
            self.taken.append(name)
            return True

        return take


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_waiter_with_room_and_no_one_ahead_does_not_wait() -> None:
    async def main() -> None:
        queue, slots = WaitQueue(Clock()), Slots(free=1)
        await queue.wait(1.0, None, slots.take("a"))
        assert (slots.taken, len(queue)) == (["a"], 0)

    asyncio.run(main())


def test_waiters_go_in_arrival_order_as_capacity_returns_and_the_head_holds_the_line() -> None:
    async def main() -> None:
        queue, slots = WaitQueue(Clock()), Slots()
        arrivals = {"b": 2.0, "c": 3.0, "a": 1.0, "c2": 3.0}
        waiters = {name: asyncio.create_task(queue.wait(at, None, slots.take(name))) for name, at in arrivals.items()}
        await _settle()
        assert len(queue) == 4
        slots.free = 2
        queue.wake()
        await _settle()
        assert slots.taken == ["a", "b"]
        assert [name for name, task in waiters.items() if task.done()] == ["b", "a"]
        slots.free = 1
        late = asyncio.create_task(queue.wait(4.0, None, Slots(free=1).take("late")))  # room, but others are ahead
        await _settle()
        assert not late.done()
        queue.wake()
        await _settle()
        assert (slots.taken, len(queue)) == (["a", "b", "c"], 2)  # "c2" arrived with "c", joined after it
        slots.free = 5
        queue.wake()
        await asyncio.gather(late, *waiters.values())
        assert slots.taken == ["a", "b", "c", "c2"]

    asyncio.run(main())


def test_a_waiter_past_its_deadline_leaves_and_lets_the_next_go() -> None:
    async def main() -> None:
        clock = Clock()
        queue, slots = WaitQueue(clock), Slots()
        first = asyncio.create_task(queue.wait(1.0, clock.now + 5.0, lambda: False))  # never has room
        second = asyncio.create_task(queue.wait(2.0, clock.now + 10.0, slots.take("second")))
        await _settle()
        slots.free = 1
        clock.now += 4.9
        queue.wake()
        await _settle()
        assert (first.done(), second.done()) == (False, False)  # the first holds the line
        clock.now += 0.1
        queue.wake()
        with pytest.raises(WaitTimedOut):
            await first
        await second
        assert (slots.taken, len(queue)) == (["second"], 0)

    asyncio.run(main())


def test_a_deadline_passes_on_its_own_timer() -> None:
    async def main() -> None:
        queue = WaitQueue()
        deadline = time.monotonic() + 0.05
        with pytest.raises(WaitTimedOut):
            await queue.wait(1.0, deadline, lambda: False)
        assert time.monotonic() >= deadline
        assert len(queue) == 0

    asyncio.run(main())


def test_a_cancelled_waiter_frees_its_place_and_no_longer_holds_the_line() -> None:
    async def main() -> None:
        queue, slots = WaitQueue(Clock()), Slots()
        head = asyncio.create_task(queue.wait(1.0, None, lambda: False))
        behind = asyncio.create_task(queue.wait(2.0, None, slots.take("behind")))
        await _settle()
        slots.free = 1
        head.cancel()
        with pytest.raises(asyncio.CancelledError):
            await head
        await behind  # the head left: the one behind it goes without another wake
        assert (slots.taken, len(queue)) == (["behind"], 0)

    asyncio.run(main())


def test_a_waiter_cancelled_after_its_claim_keeps_it_for_its_caller_to_give_back() -> None:
    async def main() -> None:
        queue, slots = WaitQueue(Clock()), Slots()
        waiter = asyncio.create_task(queue.wait(1.0, None, slots.take("w")))
        await _settle()
        slots.free = 1
        queue.wake()  # claims the place and lets it go ...
        waiter.cancel()  # ... but its task is cancelled before it resumes
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert (slots.taken, slots.free, len(queue)) == (["w"], 0, 0)

    asyncio.run(main())


class CountingQueue(WaitQueue):
    """A wait queue that counts its wakes."""

    num_wakes = 0

    def wake(self) -> None:
        self.num_wakes += 1
        super().wake()


def test_with_recheck_s_the_queue_wakes_itself_only_while_waiters_wait() -> None:
    async def main() -> None:
        queue, slots = CountingQueue(Clock(), recheck_s=0.01), Slots()
        waiters = [asyncio.create_task(queue.wait(float(i), None, slots.take(f"w{i}"))) for i in range(2)]
        await asyncio.sleep(0.05)
        assert (len(queue), slots.taken) == (2, [])
        slots.free = 2  # capacity returns where no one calls wake (another process's call)
        await asyncio.wait_for(asyncio.gather(*waiters), timeout=10.0)
        assert (slots.taken, len(queue)) == (["w0", "w1"], 0)
        num_wakes = queue.num_wakes
        await asyncio.sleep(0.05)
        assert queue.num_wakes == num_wakes  # no waiter: no recheck

        plain, slots = CountingQueue(Clock()), Slots()
        waiter = asyncio.create_task(plain.wait(1.0, None, slots.take("w")))
        await _settle()
        slots.free = 1
        await asyncio.sleep(0.05)
        assert (waiter.done(), plain.num_wakes) == (False, 0)  # without recheck_s only `wake` lets it go
        plain.wake()
        await waiter

    asyncio.run(main())
