"""When the requests of an online benchmark arrive: a seeded Poisson process at a given rate."""

from __future__ import annotations

import math
import random


def poisson_arrivals(rate: float, num_requests: int, seed: int | str) -> list[float]:
    """Arrival offsets in seconds from the run's start: exponential gaps of mean 1 / rate; all 0 for rate inf."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    if math.isinf(rate):
        return [0.0] * num_requests
    rng = random.Random(seed)
    offsets: list[float] = []
    now = 0.0
    for _ in range(num_requests):
        now += rng.expovariate(rate)
        offsets.append(now)
    return offsets


def parse_rates(text: str) -> list[float]:
    """`"2,4,8"` -> [2.0, 4.0, 8.0] (`inf` allowed: everything at once); positive, ascending as given."""
    rates = [float(part) for part in text.split(",") if part.strip()]
    if not rates or any(rate <= 0 for rate in rates):
        raise ValueError(f"expected a comma-separated list of positive rates, got {text!r}")
    return rates
