"""A step's sampled tokens on their way to the host: the runner returns at once, `result()` waits for the device.

With speculative decoding a request that verified k proposals has k + 1 rows of samples: `result()` accepts the
proposals up to the first that differs from the sample at its place; the sample after the last accepted one is the
request's next token.
"""

from __future__ import annotations

import torch

from engine.beam.candidates import BeamCandidates
from engine.sampler import SamplerOutput
from engine.scheduler_output import RunnerOutput


class PendingOutput:
    """Starts the device-to-host copy of a step's sampled tokens (and log-probs) without waiting for it."""

    def __init__(
        self,
        req_ids: list[str],
        sampled: SamplerOutput,
        drafts: list[list[int]] | None = None,
        beams: BeamCandidates | None = None,
    ) -> None:
        self._req_ids = req_ids
        self._drafts = drafts
        self._beams = None if beams is None else beams.to_host()
        self._event: torch.cuda.Event | None = None
        if sampled.token_ids.device.type == "cuda":
            # NOTE: pinned host tensors come from torch's caching host allocator, which keeps each one until the
            # copy that targets it has run; the event marks when both copies have.
            sampled = SamplerOutput(
                _to_pinned(sampled.token_ids), None if sampled.logprobs is None else _to_pinned(sampled.logprobs)
            )
            self._event = torch.cuda.Event()
            self._event.record()
        self._sampled = sampled

    def ready(self) -> bool:
        """Whether `result()` would return without waiting for the device."""
        return self._event is None or self._event.query()

    def result(self) -> RunnerOutput:
        if self._event is not None:
            self._event.synchronize()
        token_ids, logprobs = self._sampled.to_lists()
        if self._beams is not None:
            return _with_beams(self._req_ids, token_ids, logprobs, self._beams)
        if len(token_ids) == len(self._req_ids):
            return RunnerOutput(
                dict(zip(self._req_ids, token_ids, strict=True)), dict(zip(self._req_ids, logprobs, strict=True))
            )
        assert self._drafts is not None
        return _verified(self._req_ids, self._drafts, token_ids, logprobs)


def _verified(
    req_ids: list[str], drafts: list[list[int]], token_ids: list[int], logprobs: list[float | None]
) -> RunnerOutput:
    output = RunnerOutput()
    row = 0
    for req_id, draft in zip(req_ids, drafts, strict=True):
        num_accepted = 0
        while num_accepted < len(draft) and token_ids[row + num_accepted] == draft[num_accepted]:
            num_accepted += 1
        end = row + num_accepted
        output.sampled_token_ids[req_id], output.logprobs[req_id] = token_ids[end], logprobs[end]
        if draft:
            output.accepted_token_ids[req_id] = token_ids[row:end]
            output.accepted_logprobs[req_id] = logprobs[row:end]
        row += len(draft) + 1
    return output


def _with_beams(
    req_ids: list[str], token_ids: list[int], logprobs: list[float | None], beams: BeamCandidates
) -> RunnerOutput:
    """Beam rows report their candidates, not a sampled token (the scheduler appends nothing to them)."""
    candidates = beams.to_lists()
    output = RunnerOutput(beam_candidates=candidates)
    for req_id, token_id, logprob in zip(req_ids, token_ids, logprobs, strict=True):
        if req_id not in candidates:
            output.sampled_token_ids[req_id], output.logprobs[req_id] = token_id, logprob
    return output


def _to_pinned(tensor: torch.Tensor) -> torch.Tensor:
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host


NO_OUTPUT = PendingOutput([], SamplerOutput(torch.empty(0, dtype=torch.int64), None))
