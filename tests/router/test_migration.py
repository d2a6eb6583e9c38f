"""Planning of a completion's next leg, the backoff between legs and the router's retry budget: exact values."""

from __future__ import annotations

import random

import pytest

from common.sampling_params import SamplingParams
from router.completion.migration import BACKOFF_BASE_S, BACKOFF_MAX_S, LegInput, RetryBudget, backoff_s, next_leg


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_next_leg_continues_from_the_emitted_tokens() -> None:
    params = SamplingParams(temperature=0.7, seed=11, max_tokens=200, stop=("END",))
    assert next_leg([1, 2, 3], [], params) == LegInput([1, 2, 3], params)
    leg = next_leg([1, 2, 3], [40, 41, 42, 43], params)
    assert leg is not None
    assert leg.token_ids == [1, 2, 3, 40, 41, 42, 43]
    assert (leg.params.max_tokens, leg.params.seed, leg.params.temperature, leg.params.stop) == (196, 11, 0.7, ("END",))
    last = next_leg([1, 2, 3], list(range(199)), params)
    assert last is not None and (len(last.token_ids), last.params.max_tokens) == (202, 1)


def test_no_next_leg_once_max_tokens_were_emitted() -> None:
    params = SamplingParams(max_tokens=4)
    assert next_leg([1], [5, 6, 7, 8], params) is None


def test_backoff_doubles_within_its_jitter_and_is_capped() -> None:
    seeded = random.Random(7)
    draws = [seeded.random() for _ in range(3)]
    rng = random.Random(7)
    assert [backoff_s(n, rng) for n in (1, 2, 3)] == [
        0.02 * (0.5 + 0.5 * draws[0]),
        0.04 * (0.5 + 0.5 * draws[1]),
        0.08 * (0.5 + 0.5 * draws[2]),
    ]
    assert backoff_s(1, rng) >= BACKOFF_BASE_S / 2
    rng = random.Random(0)
    capped = [backoff_s(n, rng) for n in range(7, 40)]
    assert all(BACKOFF_MAX_S / 2 <= delay <= BACKOFF_MAX_S for delay in capped)


@pytest.mark.parametrize("rng_seed", [0, 1, 2])
def test_backoff_bounds_of_the_first_failures(rng_seed: int) -> None:
    rng = random.Random(rng_seed)
    for num_failures, ceiling in ((1, 0.02), (2, 0.04), (3, 0.08), (6, 0.64), (7, 1.0)):
        assert ceiling / 2 <= backoff_s(num_failures, rng) <= ceiling


def test_retry_budget_spends_its_burst_then_refills_at_its_rate() -> None:
    clock = _Clock()
    budget = RetryBudget(rate_per_s=2.0, burst=3, clock=clock)
    assert [budget.try_acquire() for _ in range(4)] == [True, True, True, False]
    assert budget.retry_after_s() == 0.5
    clock.now += 0.25
    assert (budget.try_acquire(), budget.retry_after_s()) == (False, 0.25)
    clock.now += 0.25
    assert [budget.try_acquire(), budget.try_acquire()] == [True, False]
    clock.now += 60.0
    assert [budget.try_acquire() for _ in range(4)] == [True, True, True, False]


def test_an_empty_budget_without_refill_advises_the_longest_backoff() -> None:
    budget = RetryBudget(rate_per_s=0.0, burst=1, clock=_Clock())
    assert (budget.try_acquire(), budget.try_acquire(), budget.retry_after_s()) == (True, False, BACKOFF_MAX_S)
