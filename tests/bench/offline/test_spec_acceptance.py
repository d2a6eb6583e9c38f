"""The exact acceptance count of a greedy output, the implied speedup, and the task files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.offline.spec_acceptance import AcceptanceCounts, count_acceptance, implied_speedup, load_task_set
from engine.spec.ngram import NgramProposer

TASKS = Path(__file__).parents[3] / "bench" / "offline" / "spec_tasks"


class _Fixed:
    """Proposes the given tokens at each context length (nothing where none is given), and records k."""

    def __init__(self, by_length: dict[int, list[int]]) -> None:
        self.by_length = by_length
        self.asked: list[tuple[int, int]] = []

    def propose(self, token_ids: np.ndarray, k: int) -> np.ndarray:
        self.asked.append((len(token_ids), k))
        return np.asarray(self.by_length.get(len(token_ids), [])[:k], dtype=np.int64)


def test_steps_advance_by_accepted_plus_one() -> None:
    # Prompt of 2, output [10, 11, 12, 13, 14, 15]. Step 1 at context 3: proposes [11, 12, 99] -> accepts 2 and
    # emits 11, 12, 13. Step 2 at context 6: proposes [14] -> accepts it, emits 14, 15 (the end).
    proposer = _Fixed({3: [11, 12, 99], 6: [14]})
    counts = count_acceptance([1, 2], [10, 11, 12, 13, 14, 15], proposer, k=3)
    assert counts == AcceptanceCounts(draft_tokens=4, accepted_tokens=3, verify_steps=2, decode_steps=2)
    # k is capped by the tokens left after the step's own: 5 left at context 3, 2 left at context 6.
    assert proposer.asked == [(3, 3), (6, 1)]
    assert counts.acceptance_rate == 0.75 and counts.mean_accepted_length == 2.5 and counts.tokens_per_step == 2.5


def test_steps_without_a_proposal_emit_one_token() -> None:
    # Context 2: nothing; context 3: [7] (k capped at 1), wrong; context 4: the last token, k = 0, not asked.
    proposer = _Fixed({3: [7, 7]})
    counts = count_acceptance([1], [5, 6, 8, 9], proposer, k=2)
    assert counts == AcceptanceCounts(draft_tokens=1, accepted_tokens=0, verify_steps=1, decode_steps=3)
    assert proposer.asked == [(2, 2), (3, 1)]
    assert counts.tokens_per_step == 1.0 and counts.mean_accepted_length == 1.0


def test_one_token_output_has_no_decode_step() -> None:
    counts = count_acceptance([1, 2, 3], [4], _Fixed({}), k=4)
    assert counts == AcceptanceCounts() and counts.tokens_per_step == 0.0


def test_ngram_on_a_repeated_line() -> None:
    # The output copies the prompt [5, 6, 7, 8] after its first token 5. Context 5 ([5,6,7,8,5]): the suffix [5]
    # last occurred at 0, so [6, 7, 8] (k=3) -> all accepted, and the step's own token 0 ends the output.
    counts = count_acceptance([5, 6, 7, 8], [5, 6, 7, 8, 0], NgramProposer(1, 4), k=3)
    assert counts == AcceptanceCounts(draft_tokens=3, accepted_tokens=3, verify_steps=1, decode_steps=1)


def test_implied_speedup_follows_the_formula() -> None:
    counts = AcceptanceCounts(draft_tokens=8, accepted_tokens=6, verify_steps=2, decode_steps=4)  # 2.5 tok/step
    figures = implied_speedup(counts, decode_step_ms=6.0, verify_step_ms=7.5)
    assert figures == pytest.approx({"effective_tpot_ms": 3.0, "speedup": 2.0})


def test_task_files_hold_enough_prompts(tmp_path: Path) -> None:
    sets = {path.stem: load_task_set(path) for path in sorted(TASKS.glob("*.txt"))}
    assert {"code_edit", "quote_summary", "extraction"} <= set(sets)
    assert all(8 <= len(prompts) <= 16 for prompts in sets.values())
    bad = tmp_path / "bad.txt"
    bad.write_text("about\n%%%\nfirst\n%%%\n\n")
    with pytest.raises(ValueError, match=r"bad\.txt"):
        load_task_set(bad)
