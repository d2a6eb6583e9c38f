"""Turns engine token outputs into request outputs: detokenization, stop strings, n-way fan-in, best_of and beams.

A request with n completions runs as n engine requests (`{id}-{index}`, seeds seed + index); with best_of > n as
best_of of them, with log-probs, and only the n with the highest cumulative log-prob come back, once all finished. A
beam search request is one engine request whose end (`BeamSearchOutput`) carries its n beams.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from transformers import PreTrainedTokenizerBase

from common.detokenizer import IncrementalDetokenizer
from common.sampling_params import SamplingParams
from engine.outputs import CompletionOutput, RequestOutput
from engine.scheduler_output import BeamSearchOutput, EngineOutput


@dataclass(slots=True)
class _Child:
    parent: RequestOutput
    completion: CompletionOutput
    detokenizer: IncrementalDetokenizer
    params: SamplingParams


class OutputProcessor:
    """Tracks each engine request (one per completion, or per beam search) back to its user request."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self._children: dict[str, _Child] = {}

    def add_request(
        self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams
    ) -> list[tuple[str, SamplingParams]]:
        """Register a user request; returns the engine requests (id, params) to submit for it."""
        parent = RequestOutput(request_id, prompt, prompt_token_ids, [])
        if params.use_beam_search:
            self._children[request_id] = _Child(parent, CompletionOutput(0), self._detokenizer(parent, params), params)
            return [(request_id, params)]
        children = []
        num_samples = params.num_samples
        for index in range(num_samples):
            child_id = request_id if num_samples == 1 else f"{request_id}-{index}"
            # NOTE: best_of ranks the samples by cumulative log-prob: they need their log-probs.
            child_params = replace(params, n=1, best_of=None, seed=None if params.seed is None else params.seed + index)
            if num_samples > params.n:
                child_params = replace(child_params, logprobs=True)
            completion = CompletionOutput(index, logprobs=[] if child_params.logprobs else None)
            parent.outputs.append(completion)
            self._children[child_id] = _Child(parent, completion, self._detokenizer(parent, params), params)
            children.append((child_id, child_params))
        return children

    def _detokenizer(self, parent: RequestOutput, params: SamplingParams) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(
            self.tokenizer, parent.prompt_token_ids, params.stop, params.include_stop_str_in_output
        )

    def process(self, outputs: list[EngineOutput]) -> tuple[list[RequestOutput], list[str]]:
        """Apply one step's outputs; returns the user requests that changed and engine ids to abort. A best_of
        request shows only once finished, with its n best samples."""
        changed: dict[str, RequestOutput] = {}
        to_abort: list[str] = []
        for out in outputs:
            child = self._children.get(out.req_id)
            if child is None:
                continue
            if isinstance(out, BeamSearchOutput) or child.params.use_beam_search:
                self._beams(child, out)
            elif self._sample(child, out):
                to_abort.append(out.req_id)
            if child.completion.finished:
                del self._children[out.req_id]
            parent = child.parent
            if child.params.num_samples == child.params.n or child.params.use_beam_search:
                changed[parent.request_id] = parent
            elif parent.finished:
                changed[parent.request_id] = _best_of(parent, child.params)
        return list(changed.values()), to_abort

    def _sample(self, child: _Child, out: EngineOutput) -> bool:
        """Apply a sampled completion's new tokens; True when a stop string ended it before the engine did."""
        completion = child.completion
        step, num_kept = child.detokenizer.update_each(out.new_token_ids)
        completion.token_ids.extend(out.new_token_ids[:num_kept])
        if completion.logprobs is not None:
            completion.logprobs.extend(lp for lp in out.new_logprobs[:num_kept] if lp is not None)
            completion.cumulative_logprob = sum(completion.logprobs)
        completion.text = child.detokenizer.output_text
        child.parent.num_cached_tokens = out.num_cached_tokens
        if step.stop_reason is not None:
            completion.finish_reason, completion.stop_reason = "stop", step.stop_reason
        elif out.finished:
            completion.finish_reason, completion.stop_reason = out.finish_reason, out.stop_reason
        return step.stop_reason is not None and not out.finished

    def _beams(self, child: _Child, out: EngineOutput) -> None:
        """A beam search's end: its n beams, best first (an abort ends it with none)."""
        parent = child.parent
        parent.num_cached_tokens = out.num_cached_tokens
        if not isinstance(out, BeamSearchOutput):
            child.completion.finish_reason = out.finish_reason
            parent.outputs = [child.completion]
            return
        parent.outputs = []
        for index, finished in enumerate(out.beams):
            detokenizer = self._detokenizer(parent, child.params)
            detokenizer.update(finished.beam.token_ids)
            detokenizer.flush()
            parent.outputs.append(
                CompletionOutput(
                    index,
                    detokenizer.output_text,
                    list(finished.beam.token_ids),
                    list(finished.beam.logprobs) if child.params.logprobs else None,
                    finished.finish_reason,
                    finished.stop_reason,
                    finished.beam.cumulative_logprob,
                )
            )
        child.completion = parent.outputs[0]


def _best_of(parent: RequestOutput, params: SamplingParams) -> RequestOutput:
    """The n samples with the highest cumulative log-prob, best first, indexed 0..n-1."""
    best = sorted(parent.outputs, key=lambda c: -(c.cumulative_logprob or 0.0))[: params.n]
    outputs = [
        replace(c, index=index, logprobs=c.logprobs if params.logprobs else None) for index, c in enumerate(best)
    ]
    return replace(parent, outputs=outputs)
