"""NgramProposer: exact proposals on hand-computed contexts."""

from __future__ import annotations

import numpy as np
import pytest

from engine.spec.ngram import NgramProposer


def _propose(tokens: list[int], k: int, lookup_min: int = 1, lookup_max: int = 3) -> list[int]:
    proposal = NgramProposer(lookup_min, lookup_max).propose(np.asarray(tokens, dtype=np.int64), k)
    assert proposal.dtype == np.int64 and proposal.ndim == 1
    return proposal.tolist()


def test_longest_suffix_wins_over_a_more_recent_shorter_one() -> None:
    # Suffix [2, 3] occurred at 1..2 (followed by 4, 5); the bare [3] occurred later at 5 (followed by 9).
    assert _propose([1, 2, 3, 4, 5, 3, 9, 2, 3], k=2) == [4, 5]


def test_most_recent_of_equally_long_occurrences() -> None:
    # [7, 8] occurs at 0..1 (-> 1, 2) and at 4..5 (-> 3, 4): the later one is proposed.
    assert _propose([7, 8, 1, 2, 7, 8, 3, 4, 7, 8], k=2) == [3, 4]


def test_suffix_capped_at_prompt_lookup_max() -> None:
    # With max 2 only [5, 6] is looked up: its latest occurrence (6..7) is followed by 0; the 3-gram [4, 5, 6]
    # would have matched at 1..3 (followed by 9).
    tokens = [0, 4, 5, 6, 9, 1, 5, 6, 0, 4, 5, 6]
    assert _propose(tokens, k=1, lookup_max=2) == [0]
    assert _propose(tokens, k=1, lookup_max=3) == [9]


def test_no_match_proposes_nothing() -> None:
    assert _propose([1, 2, 3, 4], k=4) == []
    assert _propose([], k=4) == []


def test_match_shorter_than_prompt_lookup_min_proposes_nothing() -> None:
    # Only the 1-gram [3] recurs (at 1, followed by 5).
    assert _propose([1, 3, 5, 2, 3], k=2, lookup_min=1) == [5, 2]
    assert _propose([1, 3, 5, 2, 3], k=2, lookup_min=2) == []


def test_min_longer_than_the_context_proposes_nothing() -> None:
    assert _propose([4, 4], k=3, lookup_min=2, lookup_max=3) == []
    assert _propose([4, 4, 4], k=3, lookup_min=2, lookup_max=3) == [4]


def test_k_larger_than_the_continuation_returns_what_there_is() -> None:
    # [1, 2] last occurred at 3..4; only 2 tokens follow it before the end.
    assert _propose([1, 2, 9, 1, 2, 8, 1, 2], k=5) == [8, 1, 2]
    assert _propose([5, 6, 7, 5, 6], k=5) == [7, 5, 6]


def test_overlapping_occurrence_at_the_end() -> None:
    # A run of one token: the latest earlier [3, 3, 3] ends one before the last token, so one token follows it.
    assert _propose([1, 3, 3, 3, 3], k=4) == [3]
    assert _propose([1, 2, 1, 2, 1, 2], k=4, lookup_max=4) == [1, 2]


def test_k_zero_and_k_one() -> None:
    assert _propose([5, 6, 7, 5, 6], k=0) == []
    assert _propose([5, 6, 7, 5, 6], k=1) == [7]


def test_match_reaching_the_start_of_the_context() -> None:
    # The 3-gram [1, 2, 3] starts at position 0.
    assert _propose([1, 2, 3, 4, 0, 1, 2, 3], k=2) == [4, 0]


def test_bad_lookup_bounds_name_the_field() -> None:
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        NgramProposer(0, 3)
    with pytest.raises(ValueError, match="prompt_lookup_max"):
        NgramProposer(3, 2)


def test_matches_a_brute_force_reference() -> None:
    rng = np.random.default_rng(0)
    proposer = NgramProposer(2, 4)
    for _ in range(300):
        tokens = rng.integers(0, 4, size=int(rng.integers(0, 40)), dtype=np.int64)
        assert proposer.propose(tokens, 3).tolist() == _reference(tokens.tolist(), 3, 2, 4)


def _reference(tokens: list[int], k: int, lookup_min: int, lookup_max: int) -> list[int]:
    n = len(tokens)
    for length in range(min(lookup_max, n - 1), lookup_min - 1, -1):
        suffix = tokens[n - length :]
        for start in range(n - length - 1, -1, -1):
            if tokens[start : start + length] == suffix:
                return tokens[start + length : start + length + k]
    return []
