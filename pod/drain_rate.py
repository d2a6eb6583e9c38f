"""How fast a queue drained lately, and so how long what waits in it will take.

1. `drained(amount)` each time something leaves the queue (a request, or its prompt tokens).
2. `seconds_to_drain(amount)`: how long `amount` more takes at the rate of the last `window_s`; None while nothing
   drained within it (a queue that has not drained yet, or has stalled for a whole window, has no rate).
Everything runs on one event loop: no locks.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

DRAIN_WINDOW_S = 10.0
"""How far back the drain rate looks."""
MIN_SPAN_S = 1.0
"""The shortest span the rate is taken over."""


class DrainRate:
    """Amounts that left a queue over the last `window_s`."""

    def __init__(self, window_s: float = DRAIN_WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._window_s = window_s
        self._clock = clock
        self._drained: deque[tuple[float, int]] = deque()  # (when, amount)
        self._total = 0

    def drained(self, amount: int) -> None:
        """`amount` left the queue now."""
        self._drained.append((self._clock(), amount))
        self._total += amount

    def seconds_to_drain(self, amount: float) -> float | None:
        """How long `amount` takes to drain at the recent rate; None while nothing drained within the window."""
        now = self._clock()
        while self._drained and self._drained[0][0] < now - self._window_s:
            self._total -= self._drained.popleft()[1]
        if not self._drained:
            return None
        # NOTE: the rate over the span the window covers so far (at least MIN_SPAN_S), not the whole window, so that a
        # queue that only began draining a moment ago is not taken for a slow one.
        span_s = max(now - self._drained[0][0], MIN_SPAN_S)
        return amount * span_s / max(self._total, 1)
