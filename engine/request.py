"""One generation request as the scheduler tracks it."""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

from common.multimodal import block_token_ids
from common.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.multimodal.features import ImageFeature


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED)


class Request:
    """Token ids so far (prompt + output) and how many of them have KV in the pool.

    NOTE: prefill, prefix hits and recompute after preemption are one mechanism: each step computes some of
    the tokens in `all_token_ids[num_computed_tokens:]`; a token is sampled once all are computed.
    """

    def __init__(
        self,
        req_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_ids: tuple[int, ...] = (),
        arrival_time: float | None = None,
        hold_kv: bool = False,
        block_extra_keys: tuple[str, ...] | None = None,
        mm_features: tuple[ImageFeature, ...] = (),
        recomputable: bool = True,
    ) -> None:
        self.req_id = req_id
        self.prompt_token_ids = prompt_token_ids
        self.sampling_params = sampling_params
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.stop_token_ids = frozenset(sampling_params.stop_token_ids) | (
            frozenset() if sampling_params.ignore_eos else frozenset(eos_token_ids)
        )
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0
        # NOTE: tokens sampled by steps still running on the device (async scheduling); their ids are not known yet.
        self.num_placeholders = 0
        self.num_cached_tokens: int | None = None
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.stop_reason: int | None = None
        # NOTE: a prefill pod's request keeps its blocks after finishing, until its KV has been shipped.
        self.hold_kv = hold_kv
        # NOTE: the extra keys of its block hashes (model id, per-request cache salt); None: the pool's own.
        self.block_extra_keys = block_extra_keys
        # NOTE: batch rows it holds a place for: a beam search's first beam holds its beam width until it forks.
        self.num_seqs = 1
        # NOTE: its block table was replaced, not grown (a beam took another's): the runner rewrites its row.
        self.blocks_replaced = False
        # NOTE: the prompt's images (a vision-language model's); their placeholders' embeddings come from the encoder.
        self.mm_features = mm_features
        # NOTE: False for a prompt whose KV cannot be computed here (a decode pod's image prompt: its images stayed on
        # the prefill pod): the scheduler never preempts it by recompute, only by swap, else ends it.
        self.recomputable = recomputable

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_with_placeholders(self) -> int:
        return len(self.all_token_ids) + self.num_placeholders

    def can_grow(self, max_model_len: int) -> bool:
        """False once the tokens in flight already bring it to max_tokens or max_model_len."""
        num_outputs = len(self.output_token_ids) + self.num_placeholders
        return num_outputs < self.sampling_params.max_tokens and self.num_tokens_with_placeholders < max_model_len

    @property
    def block_token_ids(self) -> list[int]:
        """The ids its block hashes cover: all_token_ids, each image's placeholders replaced by the image's hash."""
        if not self.mm_features:
            return self.all_token_ids
        return block_token_ids(self.all_token_ids, self.mm_features)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def priority(self) -> int:
        return self.sampling_params.priority

    @classmethod
    def prefilled(
        cls,
        req_id: str,
        prompt_token_ids: list[int],
        first_token_id: int,
        params: SamplingParams,
        eos_token_ids: tuple[int, ...],
        block_extra_keys: tuple[str, ...] | None = None,
        recomputable: bool = True,
    ) -> Request:
        """A request whose prompt KV is already in its blocks (received from a prefill pod) and whose
        first token was sampled there; it continues from token 2."""
        request = cls(
            req_id,
            prompt_token_ids,
            params,
            eos_token_ids,
            block_extra_keys=block_extra_keys,
            recomputable=recomputable,
        )
        request.append_output_token(first_token_id)
        request.num_computed_tokens = len(prompt_token_ids)
        return request

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def check_stop(self, max_model_len: int) -> RequestStatus | None:
        """The finished status the newest output token leads to, if any."""
        last = self.output_token_ids[-1]
        if last in self.stop_token_ids:
            self.stop_reason = last
            return RequestStatus.FINISHED_STOPPED
        if len(self.output_token_ids) >= self.sampling_params.max_tokens or self.num_tokens >= max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None
