"""What an engine refuses of a beam search request (SamplingParams checks the request on its own)."""

from __future__ import annotations

from common.errors import InvalidArgumentError
from common.sampling_params import SamplingParams
from engine.config import SchedulerConfig


def check_beam_search(params: SamplingParams, scheduler: SchedulerConfig, speculative: bool) -> None:
    """Raise InvalidArgumentError naming the field: a beam width past the engine's maximum (max_beam_width, and
    max_num_seqs: every beam is a row of the batch), or beam search on an engine that speculates."""
    if not params.use_beam_search:
        return
    limit = min(scheduler.max_beam_width, scheduler.max_num_seqs)
    field = "n" if params.best_of is None else "best_of"
    if params.beam_width > limit:
        raise InvalidArgumentError(field, f"beam width must be <= {limit} on this engine, got {params.beam_width}")
    if speculative:
        raise InvalidArgumentError("use_beam_search", "beam search does not run with speculative decoding")
