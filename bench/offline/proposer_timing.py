"""Microbenchmark of the n-gram proposer: microseconds per `propose` call on random contexts, and what a batch of
calls (one per running request) costs a step. `python -m bench.offline.proposer_timing` prints the figures as JSON."""

from __future__ import annotations

import json
import time

import numpy as np

from engine.spec.ngram import NgramProposer


def time_ngram(context_len: int, batch_size: int, vocab_size: int, k: int = 4, repeats: int = 5) -> dict[str, float]:
    """One call per context of a batch, `repeats` times over; a small vocabulary makes the last token recur often,
    the costly case (text has frequent tokens: spaces, commas, newlines)."""
    rng = np.random.default_rng(0)
    contexts = [rng.integers(0, vocab_size, context_len, dtype=np.int64) for _ in range(batch_size)]
    proposer = NgramProposer(1, 4)
    start = time.perf_counter()
    for _ in range(repeats):
        for context in contexts:
            proposer.propose(context, k)
    per_call_s = (time.perf_counter() - start) / (repeats * batch_size)
    return {
        "context_len": context_len,
        "vocab_size": vocab_size,
        "us_per_call": per_call_s * 1e6,
        "ms_per_step_at_batch": per_call_s * batch_size * 1e3,
        "batch_size": batch_size,
    }


if __name__ == "__main__":
    print(json.dumps([time_ngram(2048, 256, vocab) for vocab in (49152, 1000, 100)], indent=2))
