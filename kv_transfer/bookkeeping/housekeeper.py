"""One background thread per sender or receiver: runs the lease reaper on a period and the ownership hooks."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


class Housekeeper:
    """Calls `reap` every `interval_s` and each posted callback in posting order, on one daemon thread.

    NOTE: hooks run here, never on the caller's thread, so that a hook can call back into the backend (or take
    the engine's locks) without deadlocking; `stop` runs every callback posted before it, then ends the thread.
    """

    def __init__(self, name: str, reap: Callable[[], None], interval_s: float) -> None:
        self._reap = reap
        self._interval_s = interval_s
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def post(self, callback: Callable[[], None]) -> None:
        self._queue.put(callback)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._queue.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        next_reap = time.monotonic() + self._interval_s
        while True:
            try:
                callback = self._queue.get(timeout=max(0.0, next_reap - time.monotonic()))
            except queue.Empty:
                callback = self._reap
            if callback is None:
                return
            self._call(callback)
            if time.monotonic() >= next_reap:
                if callback is not self._reap:
                    self._call(self._reap)
                next_reap = time.monotonic() + self._interval_s

    @staticmethod
    def _call(callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:
            logger.exception("kv_transfer housekeeping callback %r failed", callback)
