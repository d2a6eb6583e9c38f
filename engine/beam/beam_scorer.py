"""Which beams go on and which are finished, step by step: transformers' beam search, for one request.

Each step every running beam offers its most likely next tokens (`Candidate`s: at least beam_width plus the number of
stop tokens of them, so that beam_width non-stop continuations always exist). As transformers' `_beam_search`:
1. rank all continuations by cumulative log-prob (the beam's score + the token's log-prob);
2. the first beam_width of them that end (a stop token, or max_tokens reached) are offered to the finished
   hypotheses, scored cumulative log-prob / generated length ** length_penalty; the hypotheses keep the best
   beam_width;
3. the first beam_width that do not end are the next running beams;
4. the search is done when every continuation ended (max_tokens), when `early_stopping` is True and beam_width
   hypotheses are in, or when no running beam can still beat the worst hypothesis (the best running score over the
   current length ** length_penalty, or over max_tokens with early_stopping "never" and a positive length_penalty).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Candidate:
    """A continuation one running beam offers: its next token and that token's log-prob."""

    token_id: int
    logprob: float


@dataclass(slots=True, frozen=True)
class Beam:
    """A sequence of generated tokens (the prompt is implicit) with its per-token and cumulative log-probs."""

    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    cumulative_logprob: float = 0.0

    def extend(self, candidate: Candidate) -> Beam:
        return Beam(
            (*self.token_ids, candidate.token_id),
            (*self.logprobs, candidate.logprob),
            self.cumulative_logprob + candidate.logprob,
        )


@dataclass(slots=True, frozen=True)
class Hypothesis:
    """A finished beam and its length-penalized score."""

    beam: Beam
    score: float
    stopped: bool
    """Ended by a stop token (else by max_tokens)."""


@dataclass(slots=True, frozen=True)
class Continuation:
    """A running beam of the next step: which beam of this step it extends (`parent`) and the new beam."""

    parent: int
    beam: Beam


class BeamScorer:
    """The running beams and finished hypotheses of one beam search request; see the module docstring."""

    def __init__(
        self,
        beam_width: int,
        max_tokens: int,
        stop_token_ids: frozenset[int],
        length_penalty: float,
        early_stopping: bool | str,
    ) -> None:
        self.beam_width = beam_width
        self.max_tokens = max_tokens
        self.stop_token_ids = stop_token_ids
        self.length_penalty = length_penalty
        self.early_stopping = early_stopping
        self.running: list[Beam] = [Beam()]
        self.finished: list[Hypothesis] = []
        self.done = False
        self._improvable = True

    @property
    def num_generated(self) -> int:
        return len(self.running[0].token_ids)

    def step(self, candidates: Sequence[Sequence[Candidate]]) -> list[Continuation]:
        """Advance by one token: `candidates[i]` are running beam i's. Returns the next running beams (none once
        the search is done)."""
        assert len(candidates) == len(self.running) and not self.done
        ranked = sorted(
            (
                (beam.cumulative_logprob + c.logprob, parent, c)
                for parent, beam in enumerate(self.running)
                for c in candidates[parent]
            ),
            key=lambda item: -item[0],
        )
        length = self.num_generated + 1
        at_max = length >= self.max_tokens
        ends = [at_max or c.token_id in self.stop_token_ids for _, _, c in ranked]
        width = self.beam_width
        for (_, parent, candidate), ended in zip(ranked[:width], ends[:width], strict=True):
            if ended:
                self._offer(self.running[parent].extend(candidate), length, candidate.token_id in self.stop_token_ids)
        if all(ends):
            self.done = True
            return []
        kept = [(parent, c) for (_, parent, c), ended in zip(ranked, ends, strict=True) if not ended][:width]
        assert len(kept) == width, "too few candidates for the beam width"
        continuations = [Continuation(parent, self.running[parent].extend(c)) for parent, c in kept]
        self.running = [continuation.beam for continuation in continuations]
        self._update_done(length)
        return [] if self.done else continuations

    def _offer(self, beam: Beam, length: int, stopped: bool) -> None:
        if self.early_stopping is True and len(self.finished) == self.beam_width:
            return
        score = beam.cumulative_logprob / length**self.length_penalty
        self.finished.append(Hypothesis(beam, score, stopped))
        self.finished.sort(key=lambda hypothesis: -hypothesis.score)
        del self.finished[self.beam_width :]

    def _update_done(self, length: int) -> None:
        full = len(self.finished) == self.beam_width
        if full:
            never = self.early_stopping == "never" and self.length_penalty > 0.0
            best_length = self.max_tokens if never else length
            best_possible = self.running[0].cumulative_logprob / best_length**self.length_penalty
            self._improvable = self._improvable and best_possible > self.finished[-1].score
        self.done = not self._improvable or (full and self.early_stopping is True)

    def best(self, n: int) -> list[Hypothesis]:
        """The n best finished hypotheses, best first."""
        return self.finished[:n]
