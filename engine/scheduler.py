"""Token-budget scheduler: continuous batching with chunked prefill, prefix hits and preemption.

Each step, running requests go first (decodes and unfinished prompt chunks, in admission order), then
waiting ones are admitted while the token budget, `max_num_seqs` and free KV blocks allow. When a running
request cannot get a block, the lowest-priority running request (the newest under fcfs) is preempted: its
blocks are freed and it rejoins the front of the queue to be recomputed, mostly from the prefix cache, or with a
host tier (`KVSwapper`), a long one's blocks are swapped out to host memory and copied back when it is readmitted.
A request that cannot be recomputed (a decode pod's image prompt: its images stayed on the prefill pod) is never
preempted by recompute: later requests are preempted instead, it is swapped out if the host tier takes it, and
otherwise it ends with a ResourceExhaustedError (`FailedOutput`) so that its router prefills it again elsewhere. NOTE:
chosen over keeping the image embeddings on the decode pod, which would need a second data path beside the KV and
would run a prefill of hundreds of image tokens inside the decode batch; the re-prefill runs on a prefill pod, mostly
from its prefix cache (docs/image_inputs.md).

Async scheduling: step N+1 may be scheduled before step N's sampled tokens are known. Each sampled token counts
as a placeholder until `update_from_output` delivers it; a request whose last token is a placeholder is scheduled
with PLACEHOLDER_TOKEN_ID in its place, and one whose tokens in flight already reach its length limit is not
scheduled again. Stop tokens are seen one step late: the extra step's output is dropped. `update_from_output`
works on the very request objects its step scheduled, so an aborted request's id may be reused at once.

Speculation (`DraftSlots`): a decoding request also computes the tokens proposed after its newest one; rejected ones
are taken back, their blocks freed, before any block is hashed; accepted ones are output, each checked for a stop. A
step that proposes is scheduled once no token is in flight (`LLMEngine.step`).
"""

from __future__ import annotations

import itertools
import logging
from collections import deque

from common.errors import ResourceExhaustedError
from engine.block_pool import KVBlock
from engine.config import SchedulerConfig
from engine.kv_cache_manager import KVCacheManager
from engine.kv_tier.swapper import RECOMPUTE, SWAP, KVSwapper
from engine.multimodal.features import overlapping
from engine.request import Request, RequestStatus
from engine.scheduler_output import (
    PLACEHOLDER_TOKEN_ID,
    EngineOutput,
    FailedOutput,
    RunnerOutput,
    ScheduledRequest,
    SchedulerOutput,
)
from engine.spec.draft_slots import DraftSlots
from engine.spec.speculator import Speculator

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        kv_cache_manager: KVCacheManager,
        max_model_len: int,
        speculator: Speculator | None = None,
        swapper: KVSwapper | None = None,
    ) -> None:
        self.config = config
        self.kv = kv_cache_manager
        self.drafts = None if speculator is None else DraftSlots(speculator, kv_cache_manager, max_model_len)
        self.max_model_len = max_model_len
        self.swapper = swapper
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        self._finished_req_ids: set[str] = set()
        # Finished requests whose blocks stay allocated until `release_kv`: req_id -> num computed tokens.
        self.held_kv: dict[str, int] = {}
        # The requests each scheduled step computes, by step id, until its output is applied.
        self._in_flight: dict[int, list[Request]] = {}
        self._step_ids = itertools.count(1)
        # (source, destination) KV blocks to copy before the next step runs (beam search's copy-on-write).
        self.block_copies: list[tuple[int, int]] = []
        # Ends of requests that could neither be preempted nor go on, until the next `update_from_output`.
        self._failed: list[EngineOutput] = []

    def add_request(self, request: Request) -> None:
        self.requests[request.req_id] = request
        if self.config.policy == "priority":
            index = next((i for i, r in enumerate(self.waiting) if _rank(r) > _rank(request)), len(self.waiting))
            self.waiting.insert(index, request)
        else:
            self.waiting.append(request)

    def add_running(self, request: Request, after: Request) -> None:
        """Put a request that holds its blocks and its place in the batch (a beam forked from a running one) straight
        into the running batch, right after `after` (so a beam search's beams are preempted together, newest first)."""
        request.status = RequestStatus.RUNNING
        self.requests[request.req_id] = request
        index = next((i + 1 for i, r in enumerate(self.running) if r is after), len(self.running))
        self.running.insert(index, request)

    def abort_requests(self, req_ids: list[str]) -> list[EngineOutput]:
        outputs = []
        for req_id in req_ids:
            request = self.requests.get(req_id)
            if request is None or request.status.finished:
                self.release_kv(req_id)
                continue
            if request in self.waiting:
                self.waiting.remove(request)
            else:
                self.running.remove(request)
            self._finish(request, RequestStatus.FINISHED_ABORTED)
            outputs.append(_output(request, [], []))
        return outputs

    def release_kv(self, req_id: str) -> None:
        """Free the blocks of a held (shipped) or reserved request; unknown ids are ignored. A request still running
        (its last token in flight under async scheduling) drops its hold: its blocks are freed when it finishes."""
        self.held_kv.pop(req_id, None)
        request = self.requests.get(req_id)
        if request is None:
            self.kv.free(req_id)
        else:
            request.hold_kv = False

    def kv_progress(self, req_id: str) -> tuple[list[int], int] | None:
        """(block ids, tokens with KV computed) of a running or held request."""
        request = self.requests.get(req_id)
        if request is not None:
            return self.kv.get_block_ids(req_id), request.num_computed_tokens
        if req_id in self.held_kv:
            return self.kv.get_block_ids(req_id), self.held_kv[req_id]
        return None

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        requests: list[Request] = []
        num_preemptions = self.num_preemptions
        if self.drafts is not None:
            self.drafts.speculator.begin_step(self.running)
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = min(
                request.num_tokens_with_placeholders - request.num_computed_tokens, self.config.chunk_size, budget
            )
            if num_new <= 0 or (request.num_placeholders and not request.can_grow(self.max_model_len)):
                index += 1
                continue
            drafts = (
                [] if self.drafts is None or num_new != 1 else self.drafts.propose(request, budget, len(self.running))
            )
            if not drafts and not self._allocate_or_preempt(request, index, num_new):
                break
            trimmed = self.drafts is not None and self.drafts.take_trimmed(request.req_id)
            rewrite = request.blocks_replaced or trimmed
            scheduled.append(self._schedule(request, num_new, new_admission=rewrite, drafts=drafts))
            requests.append(request)
            budget -= num_new + len(drafts)
            index += 1
        if self.num_preemptions == num_preemptions:
            self._admit_waiting(budget, scheduled, requests)
        finished, self._finished_req_ids = frozenset(self._finished_req_ids), set()
        step_id = next(self._step_ids)
        self._in_flight[step_id] = requests
        copies, self.block_copies = self.block_copies, []
        return SchedulerOutput(scheduled, finished, step_id, copies)

    def _allocate_or_preempt(self, request: Request, index: int, num_new: int) -> bool:
        """Blocks for `num_new` more tokens of running[index], preempting later requests if needed."""
        while self.kv.allocate_slots(request.req_id, request.num_computed_tokens + num_new) is None:
            victim, can_preempt = self._victim(self.running[index:])
            if can_preempt:
                self._preempt(victim)
            else:
                self._fail_unrecomputable(victim)
            if victim is request:
                return False
        return True

    def _victim(self, candidates: list[Request]) -> tuple[Request, bool]:
        """The request to take out of the batch, and whether it can be preempted (else it must end).

        In preemption order (the lowest priority first; the newest first under fcfs), the first request that either
        can be recomputed or would be swapped out. NOTE: a request that cannot be recomputed (a decode pod's image
        prompt, `Request.recomputable`) is passed over, even for one of higher priority: preempting that one costs a
        recompute here, while ending the image prompt costs a prefill elsewhere (its images' encoding included) and
        the migration. Only when every candidate is such a request does the first in order end.
        """
        order = sorted(candidates, key=_rank, reverse=True) if self.config.policy == "priority" else candidates[::-1]
        victim = next((r for r in order if self._can_preempt(r)), None)
        return (order[0], False) if victim is None else (victim, True)

    def _can_preempt(self, request: Request) -> bool:
        if request.recomputable:
            return True
        swapper = self.swapper
        return swapper is not None and swapper.preemption_mode(request.num_computed_tokens, recomputable=False) == SWAP

    def _fail_unrecomputable(self, request: Request) -> None:
        """End a request that must leave the batch but cannot be recomputed here: its images are on the prefill pod.
        It ends with a ResourceExhaustedError, which sends its router to prefill it again, images included, on
        another pair of pods (the tokens it streamed continue its prompt)."""
        self.running.remove(request)
        self._finish(request, RequestStatus.FINISHED_ABORTED)
        error = ResourceExhaustedError(
            f"request {request.req_id} must leave the full KV pool and its prompt's images are not here to recompute "
            "it: prefill it again"
        )
        self._failed.append(
            FailedOutput(
                request.req_id, [], [], "abort", None, request.num_prompt_tokens, request.num_cached_tokens or 0, error
            )
        )
        logger.warning("ended request %s: KV pool full, its image prompt cannot be recomputed here", request.req_id)

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        mode = RECOMPUTE if self.swapper is None else self.swapper.swap_out(request)
        self.kv.free(request.req_id)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
        logger.warning(
            "preempted request %s (%s); KV pool too small for the load (%d preemptions so far)",
            request.req_id,
            mode,
            self.num_preemptions,
        )

    def _admit_waiting(self, budget: int, scheduled: list[ScheduledRequest], requests: list[Request]) -> None:
        num_seqs = sum(r.num_seqs for r in self.running)
        while self.waiting and budget > 0 and num_seqs + self.waiting[0].num_seqs <= self.config.max_num_seqs:
            request = self.waiting[0]
            if request.num_placeholders:
                break  # preempted while its last token was in flight: it waits for that token
            computed_blocks: list[KVBlock]
            if request.num_computed_tokens:
                # Prefilled elsewhere: its prompt KV already sits in blocks it holds.
                computed_blocks, num_computed = [], request.num_computed_tokens
            elif self.swapper is not None:
                computed_blocks, num_computed = self.swapper.computed_blocks(request)
            else:
                computed_blocks, num_computed = self.kv.get_computed_blocks(
                    request.req_id, request.block_token_ids, request.block_extra_keys
                )
            num_new = min(request.num_tokens - num_computed, self.config.chunk_size, budget)
            if self.kv.allocate_slots(request.req_id, num_computed + num_new, computed_blocks) is None:
                break
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_computed
            if self.swapper is not None:
                self.swapper.swap_in(request)
            if request.num_cached_tokens is None:
                request.num_cached_tokens = num_computed
            self.running.append(request)
            num_seqs += request.num_seqs
            scheduled.append(self._schedule(request, num_new, new_admission=True))
            requests.append(request)
            budget -= num_new

    def _schedule(
        self, request: Request, num_new: int, new_admission: bool, drafts: list[int] | None = None
    ) -> ScheduledRequest:
        start = request.num_computed_tokens
        end = start + num_new
        token_ids = request.all_token_ids[start:end]
        if end > request.num_tokens:
            # NOTE: at schedule time at most one token is in flight: the previous step's output is applied by now.
            assert end == request.num_tokens + 1 == request.num_tokens_with_placeholders, "two tokens in flight"
            token_ids.append(PLACEHOLDER_TOKEN_ID)
        sample = end == request.num_tokens_with_placeholders
        if sample:
            request.num_placeholders += 1
        if drafts:
            token_ids += drafts
            end += len(drafts)
        request.num_computed_tokens = end
        request.blocks_replaced = False
        return ScheduledRequest(
            req_id=request.req_id,
            token_ids=token_ids,
            num_computed_tokens=start,
            block_ids=self.kv.get_block_ids(request.req_id),
            sampling_params=request.sampling_params,
            sample=sample,
            prompt_token_ids=request.prompt_token_ids,
            output_token_ids=request.output_token_ids,
            new_admission=new_admission,
            draft_token_ids=drafts or [],
            mm_features=overlapping(request.mm_features, start, end) if request.mm_features else (),
        )

    def update_from_output(self, scheduler_output: SchedulerOutput, runner_output: RunnerOutput) -> list[EngineOutput]:
        """Apply a step's sampled tokens to the requests it computed (aborted or finished ones are skipped)."""
        outputs, self._failed = self._failed, []
        requests = self._in_flight.pop(scheduler_output.step_id)
        sampled_token_ids = runner_output.sampled_token_ids
        for scheduled, request in zip(scheduler_output.scheduled, requests, strict=True):
            status = request.status
            if scheduled.draft_token_ids and status is RequestStatus.RUNNING:
                assert self.drafts is not None
                num_accepted = len(runner_output.accepted_token_ids.get(request.req_id, ()))
                self.drafts.settle(request, len(scheduled.draft_token_ids), num_accepted)
            if status is RequestStatus.RUNNING:
                self.kv.cache_blocks(
                    request.req_id, request.block_token_ids, request.num_computed_tokens, request.block_extra_keys
                )
            elif status is not RequestStatus.PREEMPTED:
                continue  # finished or aborted while in flight
            if scheduled.sample:
                request.num_placeholders -= 1
            token_id = sampled_token_ids.get(request.req_id)
            if token_id is None:
                continue
            token_ids, logprobs = [token_id], [runner_output.logprobs.get(request.req_id)]
            if scheduled.draft_token_ids:
                token_ids = runner_output.accepted_token_ids.get(request.req_id, []) + token_ids
                logprobs = runner_output.accepted_logprobs.get(request.req_id, []) + logprobs
            outputs.append(self._append_outputs(request, status, token_ids, logprobs))
        return outputs

    def _append_outputs(
        self, request: Request, status: RequestStatus, token_ids: list[int], logprobs: list[float | None]
    ) -> EngineOutput:
        """Append the step's tokens, checking each for a stop: those after a stop are dropped."""
        for num_emitted, token_id in enumerate(token_ids, start=1):
            request.append_output_token(token_id)
            stopped = request.check_stop(self.max_model_len)
            if stopped is not None:
                # NOTE: a request preempted while this token was in flight finishes from the waiting queue.
                (self.running if status is RequestStatus.RUNNING else self.waiting).remove(request)
                self._finish(request, stopped)
                del token_ids[num_emitted:], logprobs[num_emitted:]
                break
        return _output(request, token_ids, logprobs)

    def _finish(self, request: Request, status: RequestStatus) -> None:
        request.status = status
        if request.hold_kv and status is not RequestStatus.FINISHED_ABORTED:
            self.held_kv[request.req_id] = request.num_computed_tokens
        else:
            self.kv.free(request.req_id)
        del self.requests[request.req_id]
        self._finished_req_ids.add(request.req_id)
        if self.swapper is not None:
            self.swapper.discard(request.req_id)
        if self.drafts is not None:
            self.drafts.forget(request.req_id)


def _rank(request: Request) -> tuple[int, float]:
    """Scheduling order under the priority policy: lower value first, then arrival."""
    return request.priority, request.arrival_time


def _output(request: Request, token_ids: list[int], logprobs: list[float | None]) -> EngineOutput:
    return EngineOutput(
        req_id=request.req_id,
        new_token_ids=token_ids,
        new_logprobs=logprobs,
        finish_reason=request.status.value if request.status.finished else None,
        stop_reason=request.stop_reason,
        num_prompt_tokens=request.num_prompt_tokens,
        num_cached_tokens=request.num_cached_tokens or 0,
    )
