"""Planning a completion's next leg after a failed one, and the budgets that bound how often that happens.

A leg is one Reserve + Prefill + Decode on a pair of pods (`router.completion.completion_leg`). When a leg fails after
tokens were streamed, the completion goes on with another leg on another pair:
1. the prompt plus the emitted tokens is the next leg's prompt (the prefill pod's prefix cache holds most of it);
2. max_tokens shrinks by what was emitted, so the completion still ends where it would have;
3. sampling randomness is a function of (seed, position) (`engine.sampler`), so a seeded completion samples on the
   new pair what it would have sampled on the old one.
When the emitted tokens already reached max_tokens, there is no next leg: the completion ends with "length".

Retries are bounded twice: `max_attempts` failed legs per completion, and one `RetryBudget` per router (a token
bucket), so that a fault across the cluster cannot multiply the load by the number of attempts. Per process: a router
of N processes (`--workers N`) gives each a bucket of 1/N of the rate and burst, so the whole router's budget stays
what its flags say. Between attempts
a completion waits `backoff_s`, an exponential delay with jitter.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from common.sampling_params import SamplingParams

BACKOFF_BASE_S = 0.02
"""Backoff before the attempt after the first failure (at most; jitter takes up to half of it off)."""
BACKOFF_MAX_S = 1.0
"""Longest backoff."""


@dataclass(slots=True, frozen=True)
class LegInput:
    """What one leg is asked for: its prompt and its sampling params."""

    token_ids: list[int]
    params: SamplingParams


def next_leg(prompt_token_ids: Sequence[int], emitted: Sequence[int], params: SamplingParams) -> LegInput | None:
    """The next leg of a completion that has streamed `emitted`; None when max_tokens is already reached."""
    remaining = params.max_tokens - len(emitted)
    if remaining <= 0:
        return None
    # NOTE: a first leg asks for all of max_tokens: its params are the completion's own (no copy).
    leg_params = params if remaining == params.max_tokens else dataclasses.replace(params, max_tokens=remaining)
    return LegInput([*prompt_token_ids, *emitted], leg_params)


def backoff_s(num_failures: int, rng: random.Random) -> float:
    """The wait before the attempt that follows failure number `num_failures` (1, 2, ...): uniform in [d/2, d]
    with d = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (num_failures - 1))."""
    ceiling = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (num_failures - 1))
    return ceiling * (0.5 + 0.5 * rng.random())


class RetryBudget:
    """A token bucket of retries, this router process's (per process: see the module docstring): `burst` at most,
    refilled at `rate_per_s`."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate_per_s = rate_per_s
        self._burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._updated = clock()

    def try_acquire(self) -> bool:
        """Take one retry from the bucket; False (nothing taken) when it is empty."""
        self._refill()
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def retry_after_s(self) -> float:
        """How long until the bucket holds one retry again (0 when it does now)."""
        self._refill()
        if self._tokens >= 1.0:
            return 0.0
        if self._rate_per_s <= 0:
            return BACKOFF_MAX_S
        return (1.0 - self._tokens) / self._rate_per_s

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._updated) * self._rate_per_s)
        self._updated = now
