"""The replay proposer: proposes a recorded greedy continuation, a given fraction of it corrupted.

It measures the speculation mechanism at a controlled acceptance rate (random weights give no real one) and drives
the exactness tests. How recordings are handed to it:

1. run the prompts once without speculation (greedy) and keep each prompt's output token ids;
2. build the engine with `speculative_config={"method": "replay", "replay_corruption": f, ...}`;
3. call `engine.set_replay_recordings({tuple(prompt_token_ids): output_token_ids, ...})` (`LLMEngine`), which
   replaces the recordings of that engine's `ReplayProposer` (`record`, below).

`propose(token_ids, k)` finds the recording whose prompt `token_ids` starts with and whose continuation so far
equals the rest of `token_ids`, then proposes the next k recorded tokens. A request that left its recording (a
different prompt, or sampled away from it) gets no proposal. The proposed token at absolute position p is
corrupted (replaced by another id) iff a fixed hash of p falls below the fraction, so runs are reproducible and
about that fraction of proposals is wrong whatever the batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)
_HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)


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
