"""Speculator: proposal lengths from the acceptance average, the stop below min_acceptance, probes, the batch
switch, and the counters."""

from __future__ import annotations

import numpy as np

from common.sampling_params import SamplingParams
from engine.request import Request
from engine.spec.config import SpeculativeConfig
from engine.spec.speculator import Speculator
from engine.spec.stats import SpecStats


class CountingProposer:
    """Proposes 100, 101, ... (k of them) and counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def propose(self, token_ids: np.ndarray, k: int) -> np.ndarray:
        self.calls += 1
        return np.arange(100, 100 + k, dtype=np.int64)


def decoding(req_id: str = "a", max_tokens: int = 100) -> Request:
    request = Request(req_id, [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=max_tokens))
    request.append_output_token(4)
    request.num_computed_tokens = 3
    return request


def test_lengths_fall_with_acceptance_then_probe() -> None:
    speculator = Speculator(SpeculativeConfig(num_speculative_tokens=4, probe_interval=3), CountingProposer())
    request = decoding()
    lengths = []
    for _ in range(10):
        drafts = speculator.propose(request, max_new=8, num_running=1)
        lengths.append(len(drafts))
        if drafts:
            speculator.record("a", len(drafts), 0)
    # ema 1.0 -> 0.7 -> 0.49 -> 0.343 -> 0.24 (below 0.25: stop); a probe every third step after that.
    assert lengths == [4, 3, 1, 1, 0, 0, 4, 0, 0, 4]
    assert speculator.stats == SpecStats(draft_tokens=17, accepted_tokens=0, verify_steps=6)


def test_limits_batch_switch_and_in_flight_tokens() -> None:
    config = SpeculativeConfig(num_speculative_tokens=4, disable_by_batch_size=8)
    proposer = CountingProposer()
    speculator = Speculator(config, proposer)
    assert speculator.propose(decoding(max_tokens=3), max_new=8, num_running=1) == [100]
    assert speculator.propose(decoding(), max_new=2, num_running=1) == [100, 101]
    assert speculator.propose(decoding(), max_new=8, num_running=8) == []
    assert not speculator.wants_to_propose([decoding(str(i)) for i in range(8)])
    in_flight = decoding("b")
    in_flight.num_placeholders = 1
    assert speculator.propose(in_flight, max_new=8, num_running=1) == []
    assert proposer.calls == 2
    speculator.record("a", 4, 3)
    assert (speculator.stats.acceptance_rate, speculator.stats.mean_accepted_length) == (0.75, 4.0)


class MissingProposer:
    """Finds nothing for its first `num_misses` calls, then proposes 100, 101, ..."""

    def __init__(self, num_misses: int) -> None:
        self.num_misses = num_misses
        self.calls = 0

    def propose(self, token_ids: np.ndarray, k: int) -> np.ndarray:
        self.calls += 1
        return np.arange(100, 100 + k, dtype=np.int64) if self.calls > self.num_misses else np.zeros(0, np.int64)


def asking_steps(back_off: bool, num_steps: int) -> tuple[list[int], list[int]]:
    """The steps at which the speculator said it wants to propose, and those at which it asked the proposer."""
    proposer = MissingProposer(num_misses=4)
    config = SpeculativeConfig(num_speculative_tokens=2, probe_interval=8)
    speculator = Speculator(config, proposer, back_off=back_off)
    request = decoding()
    wanted, asked = [], []
    for step in range(num_steps):
        if speculator.wants_to_propose([request]):
            wanted.append(step)
        calls = proposer.calls
        speculator.propose(request, max_new=8, num_running=1)
        if proposer.calls > calls:
            asked.append(step)
    return wanted, asked


def test_a_request_whose_proposer_finds_nothing_backs_off() -> None:
    # Pauses of 1, 2, 4, 8 (probe_interval) steps after each miss; the fifth ask finds tokens: every step again.
    wanted, asked = asking_steps(back_off=True, num_steps=25)
    assert asked == wanted == [0, 2, 6, 14, 22, 23, 24]
    wanted, asked = asking_steps(back_off=False, num_steps=6)
    assert asked == wanted == [0, 1, 2, 3, 4, 5]
