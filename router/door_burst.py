"""A burst at the router's door, and the calls let in waiting it out.

gRPC's asyncio server takes new calls one at a time from its completion queue, through a poller thread that needs the
GIL, and each on a turn of the router's one event loop. So when hundreds of calls arrive at once and the few let in
start their work (reading the request, tokenizing, routing, reserving), the rest reach the door only between those
steps, and the calls that the door will only refuse wait for work they have no part in: on the 2-core machine a
300-call burst's first refusal went out ~130 ms after its send, behind the 64 calls let in.

So a call let in while calls arrive in a burst (`arrived`: BURST_CALLS within BURST_WINDOW_S, far above what a steady
load sends), or while the router's queue is filling (router.admission_interceptor asks), waits (`settled`) until
fewer than BURST_CALLS calls arrived in the last QUIET_S, at most MAX_DEFER_S, and the door answers the burst first.
QUIET_S is long enough that a hiccup in the middle of a burst (a client or the garbage collector pausing) does not
let the waiting calls' work in between its arrivals, and a steady load (under BURST_CALLS / QUIET_S = 200 calls/s)
lets a waiting call go at once. Other calls go on at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

BURST_CALLS = 4
BURST_WINDOW_S = 0.005
"""BURST_CALLS arrivals within BURST_WINDOW_S make a burst (800 calls/s for that moment)."""
QUIET_S = 0.02
"""A burst has passed once fewer than BURST_CALLS calls arrived within QUIET_S."""
MAX_DEFER_S = 0.25
"""Longest a call let in waits for a burst to pass (a burst that does not pass is a flood: serve anyway)."""


class DoorBurst:
    """Arrivals at the door (`arrived`), and a wait (`settled`) for the calls let in during a burst."""

    def __init__(
        self,
        burst_calls: int = BURST_CALLS,
        window_s: float = BURST_WINDOW_S,
        quiet_s: float = QUIET_S,
        max_defer_s: float = MAX_DEFER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._window_s = window_s
        self._quiet_s = quiet_s
        self._max_defer_s = max_defer_s
        self._clock = clock
        self._arrivals: deque[float] = deque(maxlen=burst_calls)
        self._settled: asyncio.Future[None] | None = None
        self._watcher: asyncio.Task[None] | None = None  # NOTE: held so that the running task is not collected

    def arrived(self) -> bool:
        """A call came to the door (let in or refused): whether it came in a burst (or while one is waited out)."""
        now = self._clock()
        self._arrivals.append(now)
        return self._settled is not None or now - self._oldest() <= self._window_s

    async def settled(self) -> None:
        """Once fewer than `burst_calls` calls arrived within the last `quiet_s`, or `max_defer_s` after the first
        call that waited (every call waiting for the same burst goes on at the same time)."""
        if self._settled is None:
            self._settled = asyncio.get_running_loop().create_future()
            self._watcher = asyncio.create_task(self._watch(self._settled))
        # NOTE: shielded: a waiting call that is cancelled must not cancel the others' wait.
        await asyncio.shield(self._settled)

    async def _watch(self, settled: asyncio.Future[None]) -> None:
        deadline = self._clock() + self._max_defer_s
        # NOTE: the oldest of the last `burst_calls` arrivals leaves the window at its arrival + quiet_s.
        while (now := self._clock()) < (until := min(self._oldest() + self._quiet_s, deadline)):
            await asyncio.sleep(until - now)
        self._settled = None
        self._watcher = None
        settled.set_result(None)

    def _oldest(self) -> float:
        """When the oldest of the last `burst_calls` arrivals came (-inf while fewer came)."""
        return self._arrivals[0] if len(self._arrivals) == self._arrivals.maxlen else -float("inf")
