"""Plain data the scheduler and the model runner exchange: no queues in, no tensors out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from common.errors import PdserveError
from common.sampling_params import SamplingParams
from engine.beam.beam_scorer import Beam, Candidate

if TYPE_CHECKING:
    from engine.multimodal.features import ImageFeature

PLACEHOLDER_TOKEN_ID = -1
"""Stands for a token sampled by the step still running on the device (async scheduling): the runner takes its id
from that step's device output, the host never waits for it."""


# NOTE: ScheduledRequest and EngineOutput are made per request per step: not frozen, since a frozen dataclass's
# __init__ costs ~5x (3 us vs 0.6 us for 9 fields), which adds up to milliseconds a step at batch 256.
@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step: compute KV for `token_ids` at positions `num_computed_tokens`...

    The last of `token_ids` may be PLACEHOLDER_TOKEN_ID: the token the previous step is still sampling.
    `block_ids` grows while a request runs (and shrinks back when proposed tokens are rejected); `new_admission`
    marks the first step after (re)admission. `draft_token_ids` (speculative decoding) are the last of `token_ids`:
    proposed tokens the step verifies, sampling after each of them too. `mm_features` are the prompt's images whose
    placeholders are among `token_ids`: their embeddings replace those tokens'.
    """

    req_id: str
    token_ids: list[int]
    num_computed_tokens: int
    block_ids: list[int]
    sampling_params: SamplingParams
    sample: bool  # the step completes this request's tokens: sample the next one
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    new_admission: bool = True
    draft_token_ids: list[int] = field(default_factory=list)
    mm_features: tuple[ImageFeature, ...] = ()  # images with placeholders among token_ids


@dataclass(slots=True, frozen=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest]
    finished_req_ids: frozenset[str] = frozenset()
    step_id: int = 0
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    """(source, destination) KV block ids to copy before the step runs (beam search's copy-on-write)."""


@dataclass(slots=True, frozen=True)
class RunnerOutput:
    """Each sampling request's next token (a beam's candidates instead); a request that verified proposals also gets
    the proposals accepted before it (`accepted_token_ids`, with their log-probs), absent when none was."""

    sampled_token_ids: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, float | None] = field(default_factory=dict)
    accepted_token_ids: dict[str, list[int]] = field(default_factory=dict)
    accepted_logprobs: dict[str, list[float | None]] = field(default_factory=dict)
    beam_candidates: dict[str, list[Candidate]] = field(default_factory=dict)
    """A beam search row's most likely next tokens, instead of a sampled one (absent from sampled_token_ids)."""


@dataclass(slots=True)
class EngineOutput:
    """What one step produced for one request."""

    req_id: str
    new_token_ids: list[int]
    new_logprobs: list[float | None]
    finish_reason: str | None  # "stop", "length", "abort"
    stop_reason: int | None  # the stop token id that matched, if any
    num_prompt_tokens: int
    num_cached_tokens: int

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def __reduce__(self) -> tuple[type[EngineOutput], tuple[object, ...]]:
        # NOTE: a pod's engine core pickles every step's outputs to its pod: rebuilt from the constructor's
        # arguments, they cost ~2.5x less both ways than the slots dataclass's default state protocol.
        return EngineOutput, (
            self.req_id,
            self.new_token_ids,
            self.new_logprobs,
            self.finish_reason,
            self.stop_reason,
            self.num_prompt_tokens,
            self.num_cached_tokens,
        )


@dataclass(slots=True)
class BeamSearchOutput(EngineOutput):
    """The end of a beam search request: its n best `beams`, best first (each with its finish reason); the
    inherited fields describe the best one."""

    beams: list[FinishedBeam] = field(default_factory=list)

    def __reduce__(self) -> tuple[type[EngineOutput], tuple[object, ...]]:
        # NOTE: EngineOutput's arguments by name: zero-argument super() fails in a slots dataclass.
        return BeamSearchOutput, (*EngineOutput.__reduce__(self)[1], self.beams)


@dataclass(slots=True)
class FailedOutput(EngineOutput):
    """The end of a request the engine could not serve on: `error` says why (finish_reason "abort"). A decode pod's
    image prompt that had to leave the batch ends so, with a ResourceExhaustedError (see `Scheduler`)."""

    error: PdserveError

    def __reduce__(self) -> tuple[type[EngineOutput], tuple[object, ...]]:
        return FailedOutput, (
            self.req_id,
            self.new_token_ids,
            self.new_logprobs,
            self.finish_reason,
            self.stop_reason,
            self.num_prompt_tokens,
            self.num_cached_tokens,
            self.error,
        )


@dataclass(slots=True, frozen=True)
class FinishedBeam:
    """One returned beam: its tokens and log-probs, score (cumulative log-prob / length ** length_penalty) and why
    it ended ("stop" with the stop token in `stop_reason`, or "length")."""

    beam: Beam
    score: float
    finish_reason: str
    stop_reason: int | None
