"""The replay proposer: proposes a recorded greedy continuation, a given fraction of it corrupted.

It measures the speculation mechanism at a controlled acceptance rate (random weights give no real one) and drives
the exactness tests. How recordings are handed to it:

1. run the prompts once without speculation (greedy) and keep each prompt's output token ids;
2. build the engine with `speculative_config={"method": "replay", "replay_corruption": f, ...}`;
3. call `engine.set_replay_recordings({tuple(prompt_token_ids): output_token_ids, ...})` (`LLMEngine`), which
   replaces the recordings of that engine's `ReplayProposer` (`record`, below).

In 16-bit floating point the recording of step 1 holds only as long as no argmax is a near tie: a verify step
(k + 1 tokens of a request in one forward pass) rounds differently from one-token steps, and on random weights, whose
logits are near ties every few dozen tokens, the greedy output with speculation then leaves the recording (on an
H100, Qwen3-8B shape, bf16: after ~35 tokens). From there the request gets no proposals, so the acceptance measured
is not the one asked for. Exactness is not at stake (the float32 tests give transformers' tokens), only the
measurement. `replay_until_reproduced` keeps it honest: it records what the speculating engine itself outputs and
decodes again, until an output equals the recording it replayed (on a deterministic device, each round reproduces
the previous one up to where that one left its recording, and at least one token more); the engine then follows its
recording throughout. Decode from the same engine state every round (prompts already in the prefix cache).

`propose(token_ids, k)` finds the recording whose prompt `token_ids` starts with and whose continuation so far
equals the rest of `token_ids`, then proposes the next k recorded tokens. A request that left its recording (a
different prompt, or sampled away from it) gets no proposal. The proposed token at absolute position p is
corrupted (replaced by another id) iff a fixed hash of p falls below the fraction, so runs are reproducible and
about that fraction of proposals is wrong whatever the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)
_HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)

T = TypeVar("T")


class ReplayProposer:
    def __init__(self, corruption: float) -> None:
        self.corruption = corruption
        self._recordings: dict[tuple[int, ...], np.ndarray] = {}
        self._prompt_lengths: list[int] = []

    def record(self, recordings: Mapping[tuple[int, ...], Sequence[int]]) -> None:
        """Replace the recordings: prompt token ids -> the greedy output token ids that follow them."""
        self._recordings = {tuple(p): np.asarray(o, dtype=np.int64) for p, o in recordings.items()}
        self._prompt_lengths = sorted({len(p) for p in self._recordings}, reverse=True)

    def propose(self, token_ids: np.ndarray, k: int) -> np.ndarray:
        for prompt_len in self._prompt_lengths:
            if prompt_len > len(token_ids):
                continue
            continuation = self._recordings.get(tuple(token_ids[:prompt_len].tolist()))
            if continuation is None:
                continue
            done = len(token_ids) - prompt_len
            if done >= len(continuation) or not np.array_equal(token_ids[prompt_len:], continuation[:done]):
                return _EMPTY
            return self._corrupt(continuation[done : done + k].copy(), len(token_ids))
        return _EMPTY

    def _corrupt(self, proposal: np.ndarray, first_position: int) -> np.ndarray:
        positions = np.arange(first_position, first_position + len(proposal), dtype=np.uint64)
        with np.errstate(over="ignore"):
            hashed = (positions + np.uint64(1)) * _HASH_MULTIPLIER
        uniform = (hashed >> np.uint64(11)).astype(np.float64) / float(1 << 53)
        wrong = uniform < self.corruption
        # NOTE: another id that is valid for any vocabulary of 2 or more tokens.
        proposal[wrong] = np.where(proposal[wrong] > 0, proposal[wrong] - 1, 1)
        return proposal


def replay_until_reproduced(
    set_recordings: Callable[[Mapping[tuple[int, ...], Sequence[int]]], None],
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    decode: Callable[[], tuple[list[list[int]], T]],
    max_rounds: int,
) -> tuple[T, int, bool]:
    """Record `outputs` (one per prompt) with `set_recordings` (`LLMEngine.set_replay_recordings`), run `decode`
    (greedy outputs of the prompts, in order, and a measurement of that run), and repeat with the outputs it gave
    until they equal the recording (module docstring), for at most `max_rounds` rounds (at least one). Returns the
    last round's measurement, the number of rounds and whether its outputs equal its recording."""
    recorded = [list(o) for o in outputs]
    num_rounds = 0
    while True:
        num_rounds += 1
        set_recordings({tuple(p): o for p, o in zip(prompts, recorded, strict=True)})
        decoded, measurement = decode()
        if decoded == recorded or num_rounds >= max_rounds:
            return measurement, num_rounds, decoded == recorded
        recorded = decoded
