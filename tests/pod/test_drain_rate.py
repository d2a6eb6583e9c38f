"""The drain rate (pod.drain_rate): the time an amount takes at the rate of the window, and no rate without drains."""

from __future__ import annotations

from pod.drain_rate import DrainRate


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_time_to_drain_is_the_amount_over_the_rate_of_the_window_so_far() -> None:
    clock = Clock()
    rate = DrainRate(window_s=10.0, clock=clock)
    assert rate.seconds_to_drain(5) is None  # nothing drained yet: no rate
    rate.drained(4)
    assert rate.seconds_to_drain(8) == 2.0  # 4 over (at least) 1 s
    clock.now += 4.0
    rate.drained(4)
    assert rate.seconds_to_drain(8) == 4.0  # 8 over 4 s
    clock.now += 5.0
    assert rate.seconds_to_drain(8) == 9.0  # 8 over 9 s
    clock.now += 2.0  # the first drain left the window: 4 over 7 s
    assert rate.seconds_to_drain(8) == 14.0
    clock.now += 10.0
    assert rate.seconds_to_drain(8) is None  # stalled for a whole window
