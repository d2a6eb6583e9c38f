"""Housekeeper: periodic reaping and ordered hooks on one thread."""

from __future__ import annotations

import itertools
import threading
import time

from kv_transfer.bookkeeping.housekeeper import Housekeeper


def test_hooks_run_in_order_on_its_thread_and_stop_flushes_them() -> None:
    reaps: list[float] = []
    ran: list[tuple[int, str]] = []
    housekeeper = Housekeeper("test-housekeeper", lambda: reaps.append(time.monotonic()), 0.02)

    def failing() -> None:
        raise RuntimeError("a broken hook must not stop the others")

    housekeeper.post(lambda: ran.append((1, threading.current_thread().name)))
    housekeeper.post(failing)
    housekeeper.post(lambda: ran.append((2, threading.current_thread().name)))
    deadline = time.monotonic() + 10.0
    while len(reaps) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    housekeeper.post(lambda: ran.append((3, threading.current_thread().name)))
    housekeeper.stop()

    assert ran == [(1, "test-housekeeper"), (2, "test-housekeeper"), (3, "test-housekeeper")]
    # NOTE: how many reaps fit in a span depends on the machine's load; that reaps come, at least an interval apart,
    # does not.
    assert len(reaps) >= 3
    assert all(later - earlier >= 0.02 for earlier, later in itertools.pairwise(reaps))
