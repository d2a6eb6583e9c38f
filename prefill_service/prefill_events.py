"""Plain values of one Prefill call: the two things it reports (its KV goes to a `kv_transfer.KVTarget`)."""

from __future__ import annotations

from dataclasses import dataclass

from common.sampling_params import SamplingParams
from engine.scheduler_output import EngineOutput


@dataclass(slots=True, frozen=True)
class FirstToken:
    """The first sampled token, reported as soon as the engine has it (before the transfer ends)."""

    token_id: int
    logprob: float | None
    num_cached_tokens: int
    prefill_duration_s: float
    finish_reason: str | None
    """"stop" or "length" when this token already ends the request; then no transfer follows."""
    stop_reason: int | None
    """The stop token id, when finish_reason is "stop"."""

    @classmethod
    def of(cls, output: EngineOutput, params: SamplingParams, duration_s: float, max_model_len: int) -> FirstToken:
        """The first token of `output` (an engine step's output with a new token) of a request of `params`."""
        stopped = output.finish_reason == "stop"
        ends = stopped or params.max_tokens == 1 or output.num_prompt_tokens + 1 >= max_model_len
        return cls(
            token_id=output.new_token_ids[0],
            logprob=output.new_logprobs[0] if params.logprobs else None,
            num_cached_tokens=output.num_cached_tokens,
            prefill_duration_s=duration_s,
            finish_reason=("stop" if stopped else "length") if ends else None,
            stop_reason=output.stop_reason if stopped else None,
        )


@dataclass(slots=True, frozen=True)
class TransferDone:
    """The decode pod acknowledged the request's whole prompt KV."""

    num_blocks: int
    num_bytes: int
    duration_s: float


PrefillEvent = FirstToken | TransferDone
