"""The router's wait queue: calls that cannot be served now wait here, in arrival order, until capacity returns.

Lifecycle of one waiter (`WaitQueue.wait(arrival, deadline, take)`):
1. It joins in the order of `arrival` (ties: in the order they joined). A waiter that would be first in line and whose
   `take()` succeeds at once does not wait at all.
2. `wake()` (capacity may have returned: a pod list read, a call's first token or its end) lets waiters go from the
   head of the line for as long as the head's `take()` succeeds; `take` claims what the waiter waits for (its place
   in flight, say) in the same step, so the next waiter's `take` sees it taken. A head whose `take` fails holds every
   waiter behind it: none overtakes it. With `recheck_s`, the queue also wakes itself every `recheck_s` while
   waiters wait: for capacity that returns where nothing here calls `wake` (a call of another router process).
3. It leaves the line when it goes (`wait` returns), at its `deadline` (`wait` raises WaitTimedOut), or when its
   task is cancelled (its client went away, or the call's deadline passed): its place is freed at once.
NOTE: a waiter whose `take` succeeded and whose task is cancelled before it resumes keeps what `take` claimed: the
caller gives it back where it ends the call (router.admission.admission's tickets do, whatever their stage).
Per process: the waiters are this process's own calls (a process can only wake its own), in the order of their
arrivals; a call arriving in another process of the router waits in that one's queue, and takes the room it finds
without regard to this one's waiters. Everything runs on one event loop: no locks.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field


class WaitTimedOut(Exception):
    """A waiter's deadline passed before it could go."""


@dataclass(slots=True, eq=False)
class _Waiter:
    arrival: float
    seq: int
    deadline: float | None
    take: Callable[[], bool]
    future: asyncio.Future[None]
    timer: asyncio.TimerHandle | None = field(default=None)

    def key(self) -> tuple[float, int]:
        return self.arrival, self.seq


class WaitQueue:
    """Waiters in arrival order; see the module docstring."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, recheck_s: float | None = None) -> None:
        self._clock = clock
        self._recheck_s = recheck_s
        """How often the queue wakes itself while waiters wait (None: never)."""
        self._recheck: asyncio.TimerHandle | None = None
        self._waiters: list[_Waiter] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._waiters)

    async def wait(self, arrival: float, deadline: float | None, take: Callable[[], bool]) -> None:
        """Return once every waiter that arrived before `arrival` has gone and `take()` succeeded; raise WaitTimedOut
        at `deadline` (a `clock` time; None: none)."""
        waiter = _Waiter(arrival, next(self._seq), deadline, take, asyncio.get_running_loop().create_future())
        position = bisect.bisect_right(self._waiters, waiter.key(), key=_Waiter.key)
        if position == 0 and take():
            return
        self._waiters.insert(position, waiter)
        self._schedule_recheck()
        if deadline is not None:
            waiter.timer = asyncio.get_running_loop().call_later(
                max(deadline - self._clock(), 0.0), self._expire, waiter
            )
        try:
            await waiter.future
        finally:
            self._remove(waiter)
            if not _went(waiter.future):
                # NOTE: a head that leaves without going may have held up waiters that can go now.
                self._release()

    def wake(self) -> None:
        """Capacity may have returned: drop the waiters past their deadline, then let waiters go from the head while
        the head's `take()` succeeds."""
        now = self._clock()
        for waiter in [w for w in self._waiters if w.deadline is not None and w.deadline <= now]:
            self._expire(waiter)
        self._release()

    def _schedule_recheck(self) -> None:
        if self._recheck_s is not None and self._recheck is None:
            self._recheck = asyncio.get_running_loop().call_later(self._recheck_s, self._run_recheck)

    def _run_recheck(self) -> None:
        self._recheck = None
        self.wake()
        if self._waiters:
            self._schedule_recheck()

    def _release(self) -> None:
        while self._waiters:
            head = self._waiters[0]
            if head.future.done():
                # NOTE: cancelled or expired, its task not yet resumed to leave the line: it holds no one up.
                self._remove(head)
                continue
            if not head.take():
                return
            self._remove(head)
            head.future.set_result(None)

    def _expire(self, waiter: _Waiter) -> None:
        self._remove(waiter)
        if not waiter.future.done():
            waiter.future.set_exception(WaitTimedOut())

    def _remove(self, waiter: _Waiter) -> None:
        if waiter.timer is not None:
            waiter.timer.cancel()
            waiter.timer = None
        position = bisect.bisect_left(self._waiters, waiter.key(), key=_Waiter.key)
        if position < len(self._waiters) and self._waiters[position] is waiter:
            del self._waiters[position]
        if not self._waiters and self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None


def _went(future: asyncio.Future[None]) -> bool:
    """Whether the waiter of `future` was let go (not cancelled, not expired)."""
    return future.done() and not future.cancelled() and future.exception() is None
