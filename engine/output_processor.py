"""Turns engine token outputs into request outputs: detokenization, stop strings, n-way fan-in."""

from __future__ import annotations

from dataclasses import dataclass, replace

from transformers import PreTrainedTokenizerBase

from common.detokenizer import IncrementalDetokenizer
from common.sampling_params import SamplingParams
from engine.outputs import CompletionOutput, RequestOutput
from engine.scheduler_output import EngineOutput


@dataclass(slots=True)
class _Child:
    parent: RequestOutput
    completion: CompletionOutput
    detokenizer: IncrementalDetokenizer


class OutputProcessor:
    """Tracks each engine request (one per completion) back to its user request."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self._children: dict[str, _Child] = {}

    def add_request(
        self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams
    ) -> list[tuple[str, SamplingParams]]:
        """Register a user request; returns the engine requests (id, params) to submit for it."""
        parent = RequestOutput(request_id, prompt, prompt_token_ids, [])
        children = []
        for index in range(params.n):
            child_id = request_id if params.n == 1 else f"{request_id}-{index}"
            completion = CompletionOutput(index, logprobs=[] if params.logprobs else None)
            parent.outputs.append(completion)
            detokenizer = IncrementalDetokenizer(
                self.tokenizer, prompt_token_ids, params.stop, params.include_stop_str_in_output
            )
            self._children[child_id] = _Child(parent, completion, detokenizer)
            seed = None if params.seed is None else params.seed + index
            children.append((child_id, replace(params, n=1, seed=seed)))
        return children

    def process(self, outputs: list[EngineOutput]) -> tuple[list[RequestOutput], list[str]]:
        """Apply one step's outputs; returns the user requests that changed and engine ids to abort."""
        changed: dict[str, RequestOutput] = {}
        to_abort: list[str] = []
        for out in outputs:
            child = self._children.get(out.req_id)
            if child is None:
                continue
            completion = child.completion
            step, num_kept = child.detokenizer.update_each(out.new_token_ids)
            completion.token_ids.extend(out.new_token_ids[:num_kept])
            if completion.logprobs is not None:
                completion.logprobs.extend(lp for lp in out.new_logprobs[:num_kept] if lp is not None)
            completion.text = child.detokenizer.output_text
            child.parent.num_cached_tokens = out.num_cached_tokens
            if step.stop_reason is not None and not out.finished:
                to_abort.append(out.req_id)
            if step.stop_reason is not None:
                completion.finish_reason, completion.stop_reason = "stop", step.stop_reason
            elif out.finished:
                completion.finish_reason, completion.stop_reason = out.finish_reason, out.stop_reason
            if completion.finished:
                del self._children[out.req_id]
            changed[child.parent.request_id] = child.parent
        return list(changed.values()), to_abort
