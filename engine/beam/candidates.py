"""The device side of beam search: each beam row's most likely next tokens, and block copies for copy-on-write."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.beam.beam_scorer import Candidate
from engine.scheduler_output import ScheduledRequest


def num_candidates(beam_width: int, num_stop_token_ids: int, vocab_size: int) -> int:
    """Continuations a beam offers per step: enough that beam_width of all of them do not stop."""
    return min(beam_width + num_stop_token_ids, vocab_size)


class BeamCandidates:
    """The top log-probs (log_softmax of the float32 logits) of a step's beam rows; on the device until `to_lists`."""

    def __init__(self, req_ids: list[str], counts: list[int], logprobs: torch.Tensor, token_ids: torch.Tensor) -> None:
        self.req_ids = req_ids
        self.counts = counts
        self.logprobs = logprobs
        self.token_ids = token_ids

    @classmethod
    def gather(cls, logits: torch.Tensor, sampling: Sequence[ScheduledRequest]) -> BeamCandidates | None:
        """`logits` has one row per request of `sampling` (beam search runs without speculation); None without beam
        rows. NOTE: a beam request's stop_token_ids hold its EOS ids too (engine.beam.beam_search)."""
        rows = [row for row, r in enumerate(sampling) if r.sampling_params.use_beam_search]
        if not rows:
            return None
        vocab_size = logits.shape[1]
        counts = [
            num_candidates(p.beam_width, len(p.stop_token_ids), vocab_size)
            for p in (sampling[row].sampling_params for row in rows)
        ]
        logprobs = logits[rows].float().log_softmax(dim=1)
        top_logprobs, top_ids = logprobs.topk(max(counts), dim=1)
        return cls([sampling[row].req_id for row in rows], counts, top_logprobs, top_ids)

    def to_host(self) -> BeamCandidates:
        """A copy on its way to host memory (non-blocking from a CUDA device: wait for the step before reading)."""
        if self.logprobs.device.type != "cuda":
            return self
        return BeamCandidates(self.req_ids, self.counts, _to_pinned(self.logprobs), _to_pinned(self.token_ids))

    def to_lists(self) -> dict[str, list[Candidate]]:
        """Each beam row's candidates, most likely first."""
        logprobs, token_ids = self.logprobs.tolist(), self.token_ids.tolist()
        return {
            req_id: [Candidate(t, lp) for t, lp in zip(ids[:count], lps[:count], strict=True)]
            for req_id, count, ids, lps in zip(self.req_ids, self.counts, token_ids, logprobs, strict=True)
        }


def copy_blocks(kv_cache: torch.Tensor, copies: Sequence[tuple[int, int]]) -> None:
    """Copy whole KV blocks (all layers, K and V) of the pool [num_blocks, ...] from source to destination ids."""
    if not copies:
        return
    pool = kv_cache.view(kv_cache.shape[0], -1)
    if pool.element_size() == 1:
        pool = pool.view(torch.uint8)  # NOTE: index_copy_ has no fp8 kernels; a block's bytes copy the same.
    device = kv_cache.device
    sources = torch.tensor([s for s, _ in copies], dtype=torch.int64).to(device, non_blocking=True)
    destinations = torch.tensor([d for _, d in copies], dtype=torch.int64).to(device, non_blocking=True)
    pool.index_copy_(0, destinations, pool.index_select(0, sources))


def _to_pinned(tensor: torch.Tensor) -> torch.Tensor:
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host
