"""The draft-model proposer: a small model of the target's tokenizer drafts k tokens per request, the whole batch at
once, autoregressively, on the target's device.

A round (`propose(asks)`, once per engine step before it is scheduled, for the requests due to propose):
1. each request gets target KV slots for its newest token and the proposals (`allocate_slots`, as DraftSlots would
   right after; a request the pool cannot serve proposes nothing), since the draft writes its KV at those slots too;
2. the draft's KV of the request is valid up to the tokens it was fed before that still stand: all of them up to
   the previous round's newest token, then its fed proposals up to the first the target rejected (rollback is only a
   count: the target's own trim frees the blocks past them). A preempted request (its blocks freed, maybe others
   now) starts over, as does a new one: on a decode pod the draft prefills the prompt itself on the first round;
3. tokens the draft has not seen, all but the newest, are prefilled in chunks of max_num_batched_tokens (eagerly);
4. step 1 feeds the remaining 1 or 2 tokens (the newest, and after a fully accepted round the last proposal) and
   samples; steps 2..k feed the previous step's sample, which stays on the device (a placeholder, as under async
   scheduling); one wait for all k at the end. CUDA graphs serve steps 1..k (engine.spec.draft_runner).

Sampling: proposals are drawn with the request's own sampling params and the target's seed for the request, so the
draft's token at position p comes from the same (seed, p) noise as the target's sample there: a draft whose
distribution equals the target's proposes exactly the target's tokens (acceptance 1 for greedy and sampled alike),
and greedy requests take the draft's argmax. Exactness does not depend on it: the target's sample at each position
is a function of its seed, the position and the accepted prefix only, and proposals are accepted while they equal
it (PendingOutput), so the output is that of the target alone, whatever the draft proposed. NOTE: with penalties the
draft's steps 2..k do not count its own earlier proposals among the output tokens (they stay on the device), so its
proposals may differ from the target's samples there.

draft_replay (benchmarks): the draft runs every step as above, but each proposal is replay's recorded token
(engine.spec.replay) where it has one, fed to the next step in place of the draft's sample: the draft's full cost at
a controlled acceptance.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from common.sampling_params import SamplingParams
from engine.kv_cache_manager import KVCacheManager
from engine.pending_output import PendingOutput
from engine.request import Request
from engine.scheduler_output import PLACEHOLDER_TOKEN_ID, ScheduledRequest, SchedulerOutput
from engine.spec.draft_runner import DraftRunner
from engine.spec.replay import ReplayProposer

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(slots=True)
class _DraftState:
    """What the draft holds of one request: KV for `num_fed` of its tokens and then for `fed_drafts`."""

    num_preemptions: int
    params: SamplingParams
    coupled: bool
    """Whether `params` carry the target's seed (greedy: always)."""
    num_fed: int = 0
    fed_drafts: list[int] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    """The block table the draft's input batch last saw."""


@dataclass(slots=True)
class _Round:
    request: Request
    state: _DraftState
    limit: int
    start: int
    """The first position fed this round."""
    block_ids: list[int]
    new_row: bool
    """The draft's input batch must rewrite the request's block-table row (its table changed other than by growth)."""
    forced: np.ndarray


class DraftModelProposer:
    def __init__(
        self,
        runner: DraftRunner,
        kv_cache_manager: KVCacheManager,
        target_seed: Callable[[str], int | None],
        max_num_batched_tokens: int,
        steer: ReplayProposer | None = None,
    ) -> None:
        self.runner = runner
        self.kv = kv_cache_manager
        self.target_seed = target_seed
        self.max_num_batched_tokens = max_num_batched_tokens
        self.steer = steer
        self._states: dict[str, _DraftState] = {}
        self._dropped: set[str] = set()
        self._in_flight: deque[torch.cuda.Event] = deque()

    def forget(self, req_id: str) -> None:
        """The request finished or was aborted: its input-batch row goes with the next round."""
        if self._states.pop(req_id, None) is not None:
            self._dropped.add(req_id)

    def propose(self, asks: list[tuple[Request, int]]) -> list[list[int]]:
        """Up to `limit` proposed tokens after each request's newest token, for each (request, limit) of `asks`."""
        rounds = [self._start(request, limit) for request, limit in asks]
        active = [r for r in rounds if r is not None]
        if not active:
            return [[] for _ in asks]
        self._catch_up(active)
        sampled = self._draft(active)
        proposals: dict[str, list[int]] = {}
        for r in active:
            req_id = r.request.req_id
            drafted = [sampled[j][req_id] for j in range(r.limit)]
            forced = r.forced.tolist()
            tokens = forced[: r.limit] + drafted[len(forced) : r.limit]
            r.state.num_fed = r.request.num_tokens
            r.state.fed_drafts = tokens[:-1]
            r.state.block_ids = r.block_ids
            proposals[req_id] = tokens
        return [proposals.get(request.req_id, []) for request, _ in asks]

    def _start(self, request: Request, limit: int) -> _Round | None:
        """The request's round: slots, where its valid draft KV ends, its block table; None when it cannot draft."""
        num_tokens = request.num_tokens
        limit = min(limit, self.runner.max_model_len - num_tokens)
        if limit <= 0 or self.kv.allocate_slots(request.req_id, num_tokens + limit) is None:
            return None
        state = self._states.get(request.req_id)
        if state is None or state.num_preemptions != request.num_preemptions:
            state = self._states[request.req_id] = self._new_state(request)
        elif not state.coupled:
            state.params, state.coupled = self._params(request)
        num_valid = state.num_fed
        for fed, token in zip(state.fed_drafts, request.all_token_ids[num_valid:], strict=False):
            if fed != token:
                break
            num_valid += 1
        block_ids = self.kv.get_block_ids(request.req_id)
        common = min(len(block_ids), len(state.block_ids))
        new_row = not state.block_ids or block_ids[:common] != state.block_ids[:common]
        forced = _EMPTY
        if self.steer is not None:
            forced = self.steer.propose(np.asarray(request.all_token_ids, dtype=np.int64), limit)
        return _Round(request, state, limit, min(num_valid, num_tokens - 1), block_ids, new_row, forced)

    def _new_state(self, request: Request) -> _DraftState:
        params, coupled = self._params(request)
        return _DraftState(request.num_preemptions, params, coupled)

    def _params(self, request: Request) -> tuple[SamplingParams, bool]:
        """The request's params for the draft: no log-probs, and the target's seed (module docstring)."""
        params = request.sampling_params
        if params.greedy:
            return (dataclasses.replace(params, logprobs=False) if params.logprobs else params), True
        seed = params.seed if params.seed is not None else self.target_seed(request.req_id)
        return dataclasses.replace(params, seed=seed, logprobs=False), seed is not None

    def _scheduled(self, r: _Round, token_ids: list[int], start: int, sample: bool) -> ScheduledRequest:
        new_row, r.new_row = r.new_row, False
        request = r.request
        return ScheduledRequest(
            req_id=request.req_id,
            token_ids=token_ids,
            num_computed_tokens=start,
            block_ids=r.block_ids,
            sampling_params=r.state.params,
            sample=sample,
            prompt_token_ids=request.prompt_token_ids,
            output_token_ids=request.output_token_ids,
            new_admission=new_row,
        )

    def _execute(self, scheduled: list[ScheduledRequest]) -> PendingOutput:
        """Enqueue one draft step. NOTE: the runner's input batch fills two pinned staging buffers in turn, whose
        copies to the device are queued, not done: a step must not refill the one whose copies may still wait, so it
        waits for the step before the previous one (the host stays up to two steps ahead)."""
        if len(self._in_flight) == 2:
            self._in_flight.popleft().synchronize()
        dropped, self._dropped = frozenset(self._dropped), set()
        pending = self.runner.execute(SchedulerOutput(scheduled, dropped))
        if self.runner.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
            self._in_flight.append(event)
        return pending

    def _catch_up(self, rounds: list[_Round]) -> None:
        """Prefill, without sampling, every token but the newest that the draft has no valid KV for."""
        while True:
            budget = self.max_num_batched_tokens
            scheduled = []
            for r in rounds:
                # NOTE: the last 2 tokens are left to step 1, which a CUDA graph serves.
                num_new = min(r.request.num_tokens - 1 - r.start, budget)
                if r.request.num_tokens - r.start <= 2 or budget <= 0:
                    continue
                token_ids = r.request.all_token_ids[r.start : r.start + num_new]
                scheduled.append(self._scheduled(r, token_ids, r.start, sample=False))
                r.start += num_new
                budget -= num_new
            if not scheduled:
                return
            self._execute(scheduled)

    def _draft(self, rounds: list[_Round]) -> list[dict[str, int]]:
        """Steps 1..k: each request's sample at each step (the device is waited for once, at the end)."""
        step = [self._scheduled(r, r.request.all_token_ids[r.start :], r.start, sample=True) for r in rounds]
        pending = [self._execute(step)]
        for j in range(1, max(r.limit for r in rounds)):
            step = []
            for r in rounds:
                if j >= r.limit:
                    continue
                token_id = int(r.forced[j - 1]) if j - 1 < len(r.forced) else PLACEHOLDER_TOKEN_ID
                step.append(self._scheduled(r, [token_id], r.request.num_tokens + j - 1, sample=True))
            pending.append(self._execute(step))
        sampled = [p.result().sampled_token_ids for p in pending]
        self._in_flight.clear()
        return sampled
