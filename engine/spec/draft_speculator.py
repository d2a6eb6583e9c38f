"""The Speculator of a draft model: the same per-request adaptive length, asked for the whole batch at once.

Each step, before the scheduler walks the running requests (`begin_step`), every decoding request that is due to
propose (Speculator's adaptive rules: its acceptance average, pauses, `disable_by_batch_size`) is asked for, and the
draft model drafts all of them in one round (engine.spec.draft_model); the scheduler then takes each request's
proposals (`propose`), cut to its token budget. A request that finishes or is aborted is forgotten by both.
"""

from __future__ import annotations

from engine.kv_cache_manager import KVCacheManager
from engine.model_runner import ModelRunner
from engine.request import Request
from engine.spec.config import SpeculativeConfig
from engine.spec.draft_model import DraftModelProposer
from engine.spec.draft_runner import DraftRunner
from engine.spec.replay import ReplayProposer
from engine.spec.speculator import Speculator


class DraftSpeculator(Speculator):
    def __init__(
        self, config: SpeculativeConfig, draft: DraftModelProposer, max_model_len: int, back_off: bool = False
    ) -> None:
        super().__init__(config, draft.steer, back_off)
        self.draft = draft
        self.max_model_len = max_model_len
        self._planned: dict[str, list[int]] = {}

    def begin_step(self, running: list[Request]) -> None:
        self._planned.clear()
        num_running = len(running)
        if num_running >= self.config.disable_by_batch_size:
            return
        asks = []
        for request in running:
            if request.num_tokens_with_placeholders - request.num_computed_tokens != 1:
                continue  # not a decode this step (a prompt chunk, or its newest token in flight)
            limit = self._ask(request, self.max_model_len - request.num_tokens - 1, num_running)
            if limit > 0:
                asks.append((request, limit))
        if not asks:
            return
        for (request, _), drafts in zip(asks, self.draft.propose(asks), strict=True):
            self._answered(request.req_id, len(drafts))
            self._planned[request.req_id] = drafts

    def propose(self, request: Request, max_new: int, num_running: int) -> list[int]:
        return self._planned.pop(request.req_id, [])[:max_new]

    def forget(self, req_id: str) -> None:
        super().forget(req_id)
        self.draft.forget(req_id)


def draft_speculator(
    config: SpeculativeConfig,
    draft_runner: DraftRunner,
    target: ModelRunner,
    kv_cache_manager: KVCacheManager,
    max_num_batched_tokens: int,
    back_off: bool,
) -> DraftSpeculator:
    """The draft runner's pool attached beside the target's, and the speculator that drives it."""
    draft_runner.attach_pool(target.num_blocks, target.max_model_len)
    steer = ReplayProposer(config.replay_corruption) if config.method == "draft_replay" else None
    proposer = DraftModelProposer(draft_runner, kv_cache_manager, target.seeds.get, max_num_batched_tokens, steer)
    return DraftSpeculator(config, proposer, target.max_model_len, back_off)
