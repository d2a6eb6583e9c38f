"""Beam search requests in the engine: each beam is a request of the scheduler, its KV shared copy-on-write.

The life of a beam search request (`BeamSearch` drives it beside the scheduler, from the engine's step):
1. `add`: its first beam is a request like any other (on a decode pod: over the prompt KV that arrived, with the
   prompt's last token computed again for its logits). It holds beam_width places in the batch, so that the beams it
   forks into never wait for room (`Request.num_seqs`). Its stop_token_ids hold the model's EOS ids too: the runner
   returns that many more candidates per beam (engine.beam.candidates). Every beam carries the prompt's images (or,
   on a decode pod, the mark that it cannot be recomputed: `Request.recomputable`).
2. Each step the runner returns every computed beam's most likely next tokens instead of a sampled one; once every
   running beam of the request has reported, `BeamScorer.step` picks the next beams.
3. The beams are reassigned in place: beam k takes the tokens of the beam it extends plus its new token, and that
   beam's block table (`KVCacheManager.fork`: a reference more on each block, nothing copied). A beam whose next token
   falls into a block it still shares gets a copy of that block first (`KVCacheManager.copy_on_write`; the copy runs
   on the device before the next step): only the partial last block is ever copied, and only while shared, so the
   pool never holds two copies of a block nobody writes. The first step forks the one beam into beam_width.
4. When the scorer is done, every beam request ends (its blocks go back to the pool) and one `BeamSearchOutput`
   reports the n best beams. An abort ends them the same way; so does a beam that can be neither recomputed nor kept
   (the scheduler's `FailedOutput`, or no block for its copy on write), with one `FailedOutput` for the request.
Beams are scheduled only once their previous step's candidates are in (no async overlap for them: LLMEngine.step).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from common.errors import PdserveError, ResourceExhaustedError
from engine.beam.beam_scorer import BeamScorer, Candidate, Continuation
from engine.kv_cache_manager import KVCacheManager, NoFreeBlocksError
from engine.request import Request
from engine.scheduler import Scheduler
from engine.scheduler_output import BeamSearchOutput, EngineOutput, FailedOutput, FinishedBeam


@dataclass(slots=True)
class _Group:
    """One beam search request: its scorer and its beam requests (`beams[k]` runs the scorer's running beam k)."""

    req_id: str
    prompt_token_ids: list[int]
    scorer: BeamScorer
    beams: list[Request]
    reported: dict[str, list[Candidate]] = field(default_factory=dict)


class BeamSearch:
    """The engine's beam search requests, by request id; see the module docstring."""

    def __init__(self, scheduler: Scheduler, kv_cache_manager: KVCacheManager) -> None:
        self.scheduler = scheduler
        self.kv = kv_cache_manager
        self._groups: dict[str, _Group] = {}
        self._group_of_beam: dict[str, _Group] = {}

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._groups

    def add(self, request: Request) -> Request:
        """Register a beam search request; returns its first beam (with its stop ids in its params), to be added to
        the scheduler (or, prefilled, to take over the blocks reserved under the same id)."""
        params = request.sampling_params
        stop_ids = tuple(sorted(request.stop_token_ids))
        first = Request(
            request.req_id,
            request.prompt_token_ids,
            dataclasses.replace(params, stop_token_ids=stop_ids, ignore_eos=True),
            arrival_time=request.arrival_time,
            block_extra_keys=request.block_extra_keys,
            mm_features=request.mm_features,
            recomputable=request.recomputable,
        )
        first.num_seqs = params.beam_width
        scorer = BeamScorer(
            params.beam_width, params.max_tokens, frozenset(stop_ids), params.length_penalty, params.early_stopping
        )
        group = _Group(request.req_id, list(request.prompt_token_ids), scorer, [first])
        self._groups[request.req_id] = group
        self._group_of_beam[request.req_id] = group
        return first

    def update(self, beam_candidates: dict[str, list[Candidate]]) -> list[EngineOutput]:
        """Take a step's candidates; advance every request whose running beams all reported."""
        outputs: list[EngineOutput] = []
        for beam_id, candidates in beam_candidates.items():
            group = self._group_of_beam.get(beam_id)
            if group is None:
                continue  # ended while its step ran
            group.reported[beam_id] = candidates
            if len(group.reported) == len(group.scorer.running):
                outputs += self._advance(group)
        return outputs

    def abort(self, req_ids: list[str]) -> tuple[list[EngineOutput], list[str]]:
        """End the beam search requests among `req_ids`; returns their outputs and the other ids."""
        outputs: list[EngineOutput] = []
        others: list[str] = []
        for req_id in req_ids:
            group = self._groups.get(req_id)
            if group is None:
                others.append(req_id)
                continue
            self._end(group)
            outputs.append(EngineOutput(req_id, [], [], "abort", None, len(group.prompt_token_ids), 0))
        return outputs, others

    def _advance(self, group: _Group) -> list[EngineOutput]:
        candidates = [group.reported.pop(beam.req_id) for beam in group.beams[: len(group.scorer.running)]]
        continuations = group.scorer.step(candidates)
        if group.scorer.done:
            return [self._finish(group)]
        if len(group.beams) < len(continuations):
            self._add_beams(group, len(continuations))
        if not self._reassign(group, continuations):
            error = ResourceExhaustedError(
                f"beam search request {group.req_id}: no KV block for a beam's copy, and its prompt's images are not "
                "here to recompute it: prefill it again"
            )
            return [self._fail(group, error)]
        return []

    def _add_beams(self, group: _Group, width: int) -> None:
        first = group.beams[0]
        first.num_seqs = 1
        for k in range(len(group.beams), width):
            beam = Request(
                f"{group.req_id}#beam{k}",
                group.prompt_token_ids,
                first.sampling_params,
                arrival_time=first.arrival_time,
                block_extra_keys=first.block_extra_keys,
                mm_features=first.mm_features,
                recomputable=first.recomputable,
            )
            beam.num_cached_tokens = first.num_cached_tokens
            self.scheduler.add_running(beam, after=group.beams[-1])
            group.beams.append(beam)
            self._group_of_beam[beam.req_id] = group

    def _reassign(self, group: _Group, continuations: list[Continuation]) -> bool:
        """Beam k continues the beam `continuations[k].parent` was: its tokens and blocks, then its own token. False
        when a beam that cannot be recomputed finds no block for its copy (the request must end)."""
        beams = group.beams
        num_computed = [beams[c.parent].num_computed_tokens for c in continuations]
        self.kv.fork({beams[k].req_id: beams[c.parent].req_id for k, c in enumerate(continuations)})
        for beam, continuation, computed in zip(beams, continuations, num_computed, strict=True):
            beam.output_token_ids = list(continuation.beam.token_ids)
            beam.all_token_ids = group.prompt_token_ids + beam.output_token_ids
            beam.num_computed_tokens = computed
            beam.blocks_replaced = True
            try:
                copy = self.kv.copy_on_write(beam.req_id, computed)
            except NoFreeBlocksError:
                if not beam.recomputable:
                    return False
                # NOTE: recomputed from its first token instead (the scheduler preempts others for its blocks).
                self.kv.free(beam.req_id)
                beam.num_computed_tokens = 0
                continue
            if copy is not None:
                self.scheduler.block_copies.append(copy)
        return True

    def end_failed(self, outputs: list[EngineOutput]) -> list[EngineOutput]:
        """`outputs` with each beam's `FailedOutput` (a beam the scheduler could neither preempt nor keep) replaced by
        its request's: the request's other beams end too."""
        if not self._groups:
            return outputs
        kept: list[EngineOutput] = []
        ended_beam_ids: set[str] = set()
        for output in outputs:
            group = self._group_of_beam.get(output.req_id)
            if isinstance(output, FailedOutput) and group is not None:
                ended_beam_ids.update(beam.req_id for beam in group.beams)
                kept.append(self._fail(group, output.error))
            elif output.req_id not in ended_beam_ids:
                kept.append(output)
        return kept

    def _fail(self, group: _Group, error: PdserveError) -> FailedOutput:
        self._end(group)
        return FailedOutput(group.req_id, [], [], "abort", None, len(group.prompt_token_ids), 0, error)

    def _finish(self, group: _Group) -> BeamSearchOutput:
        self._end(group)
        first = group.beams[0]
        params = first.sampling_params
        beams = [
            FinishedBeam(
                h.beam,
                h.score,
                "stop" if h.stopped else "length",
                h.beam.token_ids[-1] if h.stopped else None,
            )
            for h in group.scorer.best(params.n)
        ]
        best = beams[0]
        return BeamSearchOutput(
            group.req_id,
            list(best.beam.token_ids),
            list(best.beam.logprobs),
            best.finish_reason,
            best.stop_reason,
            len(group.prompt_token_ids),
            first.num_cached_tokens or 0,
            beams,
        )

    def _end(self, group: _Group) -> None:
        del self._groups[group.req_id]
        for beam in group.beams:
            del self._group_of_beam[beam.req_id]
        self.scheduler.abort_requests([beam.req_id for beam in group.beams])
