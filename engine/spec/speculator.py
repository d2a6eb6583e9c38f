"""Decides each request's proposals per step and keeps the acceptance statistics.

A step's life for one decoding request (all of its tokens but the newest computed, none in flight):
1. `propose(request, max_new, num_running)`: up to k proposed tokens, fewer when its observed acceptance is low,
   none while `num_running >= disable_by_batch_size`; the scheduler appends them to the tokens the step computes.
2. The runner samples after the newest token and after each proposal, as it would without speculation; the
   proposals are accepted up to the first one that differs from what was sampled at its place.
3. `record(req_id, num_drafts, num_accepted)` updates the request's moving average of acceptance and the totals.

Proposal length: the most j <= k whose chance of being reached, ema**j, stays >= min_acceptance. A request whose
average fell below min_acceptance proposes nothing, except a full probe every `probe_interval` steps. A request
whose proposer found nothing (no n-gram match; a replay request off its recording) asks again 2, then 4, 8, ...
steps later (at most `probe_interval`), until the proposer finds something; with `back_off` only.

NOTE: back off under async scheduling: a step that asks must wait for the step in flight (`wants_to_propose`), so a
request that asks every step and gets nothing costs every step that wait for no gain (+10% on an H100 at batch 1).
Without async scheduling an ask costs only the proposer's call.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.request import Request
from engine.spec.config import SpeculativeConfig
from engine.spec.proposer import Proposer
from engine.spec.stats import SpecStats

_EMA_DECAY = 0.7
"""Weight of the old average: from 1.0, four steps of zero acceptance stop a request (min_acceptance 0.25)."""


@dataclass(slots=True)
class _RequestState:
    ema: float = 1.0
    idle_steps: int = 0
    """Steps since the request last asked its proposer."""
    pause: int = 1
    """Steps between asks while its acceptance is high: doubles each time the proposer finds nothing."""


class Speculator:
    def __init__(self, config: SpeculativeConfig, proposer: Proposer | None, back_off: bool = False) -> None:
        self.config = config
        # NOTE: None only under a subclass that proposes for the whole batch in `begin_step`; there, a replay
        # proposer (draft_replay) steers the draft model.
        self.proposer = proposer
        self._max_pause = config.probe_interval if back_off else 1
        self.stats = SpecStats()
        self._states: dict[str, _RequestState] = {}

    def wants_to_propose(self, requests: list[Request]) -> bool:
        """Whether a step over `requests` (the running batch) would propose for any of them: such a step must see
        every token the previous step sampled before it is scheduled."""
        if len(requests) >= self.config.disable_by_batch_size:
            return False
        for request in requests:
            state = self._states.get(request.req_id)
            if state is None or state.idle_steps + 1 >= self._pause(state):
                return True
        return False

    def begin_step(self, running: list[Request]) -> None:
        """Called before a step is scheduled, with the running batch: a proposer that drafts the whole batch at once
        (engine.spec.draft_speculator) does it here; this one proposes per request in `propose`."""

    def propose(self, request: Request, max_new: int, num_running: int) -> list[int]:
        """At most `max_new` proposed tokens to verify after the request's newest token this step (maybe none)."""
        limit = self._ask(request, max_new, num_running)
        if limit <= 0:
            return []
        assert self.proposer is not None
        drafts = self.proposer.propose(np.asarray(request.all_token_ids, dtype=np.int64), limit)
        self._answered(request.req_id, len(drafts))
        return [int(t) for t in drafts[:limit]]

    def _ask(self, request: Request, max_new: int, num_running: int) -> int:
        """How many tokens to ask the proposer for on this request's behalf this step (0: none); a positive answer
        counts as an ask, whose outcome `_answered` records."""
        if num_running >= self.config.disable_by_batch_size:
            return 0
        state = self._states.setdefault(request.req_id, _RequestState())
        state.idle_steps += 1
        if state.idle_steps < self._pause(state):
            return 0
        # NOTE: with the newest token still in flight (async scheduling) nothing can be proposed; an ask that is
        # due stays due, and `wants_to_propose` makes the engine wait for that token before the next step.
        if request.num_placeholders or request.num_computed_tokens != request.num_tokens - 1:
            return 0
        state.idle_steps = 0
        num_outputs = len(request.output_token_ids)
        length = self._length(state) or self.config.num_speculative_tokens
        return min(length, request.sampling_params.max_tokens - num_outputs - 1, max_new)

    def _answered(self, req_id: str, num_drafts: int) -> None:
        state = self._states[req_id]
        state.pause = 1 if num_drafts else min(2 * state.pause, self._max_pause)

    def _pause(self, state: _RequestState) -> int:
        """Steps from one ask of the proposer to the next: `probe_interval` below min_acceptance, else its pause."""
        return state.pause if self._length(state) else self.config.probe_interval

    def _length(self, state: _RequestState) -> int:
        length, reach = 0, state.ema
        while length < self.config.num_speculative_tokens and reach >= self.config.min_acceptance:
            length += 1
            reach *= state.ema
        return length

    def record(self, req_id: str, num_drafts: int, num_accepted: int) -> None:
        state = self._states.get(req_id)
        if state is not None:
            state.ema = _EMA_DECAY * state.ema + (1.0 - _EMA_DECAY) * num_accepted / num_drafts
        self.stats = self.stats.plus(num_drafts, num_accepted, 1)

    def forget(self, req_id: str) -> None:
        self._states.pop(req_id, None)
