"""The scheduler's side of speculation: a decoding request's proposals with KV slots for them, then, once the step
that verified them is back, the rejected ones taken back.

1. `propose(request, budget, num_running)` (schedule time): the Speculator's proposals after the request's newest
   token, with blocks allocated for them too; none when the pool is short of blocks (the newest token still runs).
2. The step computes the newest token and the proposals; the runner accepts a prefix of them.
3. `settle(request, num_drafts, num_accepted)` (update time): the rejected proposals' computed tokens are taken back
   and the blocks past the accepted ones freed (`KVCacheManager.trim`) before any block is hashed, so only verified
   tokens' blocks reach the prefix cache; the Speculator records the acceptance. The request's next step rewrites
   the runner's copy of its block table (`take_trimmed`).
4. `forget(req_id)` when it finishes or is aborted.
"""

from __future__ import annotations

from engine.kv_cache_manager import KVCacheManager
from engine.request import Request
from engine.spec.speculator import Speculator


class DraftSlots:
    def __init__(self, speculator: Speculator, kv_cache_manager: KVCacheManager, max_model_len: int) -> None:
        self.speculator = speculator
        self.kv = kv_cache_manager
        self.max_model_len = max_model_len
        self._trimmed: set[str] = set()

    def propose(self, request: Request, budget: int, num_running: int) -> list[int]:
        """Proposals to verify after a decoding request's newest token (which uses one of `budget` tokens)."""
        max_new = min(budget, self.max_model_len - request.num_tokens) - 1
        drafts = self.speculator.propose(request, max_new, num_running)
        if drafts and self.kv.allocate_slots(request.req_id, request.num_tokens + len(drafts)) is None:
            return []
        return drafts

    def settle(self, request: Request, num_drafts: int, num_accepted: int) -> None:
        """Take back the computed tokens of rejected proposals and free the blocks past the accepted ones (the slot
        of the newest token, computed next step, is kept)."""
        request.num_computed_tokens -= num_drafts - num_accepted
        if self.kv.trim(request.req_id, request.num_computed_tokens + 1):
            self._trimmed.add(request.req_id)
        self.speculator.record(request.req_id, num_drafts, num_accepted)

    def take_trimmed(self, req_id: str) -> bool:
        """Whether the request's block table lost blocks since it was last scheduled: its next step must rewrite the
        runner's copy of the table (`ScheduledRequest.new_admission`), since the table may grow back to the same
        length with other blocks, which a copy that only appends would not see."""
        if req_id not in self._trimmed:
            return False
        self._trimmed.discard(req_id)
        return True

    def forget(self, req_id: str) -> None:
        self._trimmed.discard(req_id)
        self.speculator.forget(req_id)
