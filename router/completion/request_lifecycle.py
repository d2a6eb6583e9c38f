"""One Generate call end to end: admission's first check, validate, tokenize, wait for room in the router's queue, hash,
look up the prefix directory (when more than one live prefill pod is there to choose from), then run its n
completions (`router.completion.completion_run`) and merge them into one stream. Admission
(`router.admission.admission`) refuses at once before anything else (draining, the client's streams, a full queue, a
predicted wait too long), and sends the call on once there is room; its first chunk and its end free that room. Input
limits are checked before tokenizing (`router.completion.input_checks`): ids, n and stop strings, the prompt's bytes;
its tokens after.

The completions of a call share the prompt, its block hashes and the directory's answer; each is
routed and retried on its own, and completion i with a seed uses seed + i (as vLLM does; wrapped into
int64), so the n samples differ yet stay reproducible. The stream's last chunk carries the usage of the whole call.
Closing the stream early (the client cancelled, or the deadline passed) cancels every completion,
and with them every call to a pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from common.block_hash import BlockHash, block_extra_keys, hash_block_tokens, hash_prompt_blocks
from common.errors import InvalidArgumentError
from common.multimodal import ImageInput, block_token_ids
from common.sampling_params import SamplingParams, completion_seed
from common.telemetry import (
    GEN_AI_OPERATION_CHAT,
    GEN_AI_OPERATION_NAME,
    GEN_AI_OPERATION_TEXT_COMPLETION,
    GEN_AI_REQUEST_MAX_TOKENS,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_REQUEST_TEMPERATURE,
    GEN_AI_REQUEST_TOP_P,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    PDSERVE_REQUEST_ID,
)
from router.admission.admission import Ticket
from router.completion.beam_search_run import BeamSearchRun
from router.completion.best_of import best_of, sample_params
from router.completion.completion_run import CompletionRun
from router.completion.input_checks import InputChecks
from router.completion.run_context import PromptPlan, RunContext
from router.completion.running_requests import RunningRequests
from router.config import RouterConfig
from router.model_info import ModelInfo
from router.multimodal.prompt_images import PromptImages
from router.outputs import CompletionChunk, Usage
from router.tokenizer.tokenizer_pool import ChatMessage, TokenizerPool


@dataclass(slots=True, frozen=True)
class GenerateInput:
    """A decoded Generate call; at most one of text, messages and token_ids is set."""

    request_id: str
    params: SamplingParams
    text: str | None = None
    messages: tuple[ChatMessage, ...] | None = None
    token_ids: tuple[int, ...] | None = None
    cache_salt: str | None = None
    client_id: str = ""
    """Who sent the call, for the per-client admission limit (router.admission.admission.client_id)."""


class PrefixLookup(Protocol):
    """The prefix directory's read side: common.prefix_directory.PrefixDirectory (or a test double)."""

    async def longest_prefix(self, block_hashes: Sequence[BlockHash], live: Mapping[str, int]) -> dict[str, float]:
        """Per live pod, how many leading blocks of the prompt it holds (one in its host tier counting less than one
        in its device pool); {} when unknown."""
        ...


class RequestLifecycle:
    """Runs Generate and Tokenize calls for the router's servicer."""

    def __init__(
        self,
        model: ModelInfo,
        tokenizer_pool: TokenizerPool,
        directory: PrefixLookup,
        context: RunContext,
        limits: RouterConfig | None = None,
        running: RunningRequests | None = None,
    ) -> None:
        """`limits`: the input limits (RouterConfig's `max_*` fields; default: RouterConfig's defaults); `running`:
        where the calls register for Abort (default: a new table)."""
        self._model = model
        self._checks = InputChecks(limits or RouterConfig(), model.max_model_len)
        self._images = PromptImages(model, limits or RouterConfig())
        self._tokenizer_pool = tokenizer_pool
        self._directory = directory
        self._ctx = context
        self.running = RunningRequests() if running is None else running
        """The requests being generated now, by request id, for Abort."""

    @property
    def model(self) -> ModelInfo:
        return self._model

    async def tokenize(self, text: str | None, messages: Sequence[ChatMessage] | None) -> list[int]:
        """A prompt's token ids, exactly as Generate uses them; InvalidArgumentError for an empty or oversized one."""
        return (await self._tokenize_with_images(text, messages))[0]

    async def _tokenize_with_images(
        self, text: str | None, messages: Sequence[ChatMessage] | None
    ) -> tuple[list[int], tuple[ImageInput, ...]]:
        """The prompt's token ids (each image's placeholders expanded) and its images."""
        self._checks.check_prompt_bytes(text, messages)
        if messages is not None:
            if not messages:
                raise InvalidArgumentError("messages", "must hold at least one message")
            images = self._images.check(messages)
            return self._images.place(await self._tokenizer_pool.encode_chat(messages), images)
        if text is None:
            raise InvalidArgumentError("text", "no prompt: set one of text, messages or token_ids")
        if not text:
            raise InvalidArgumentError("text", "must not be empty")
        token_ids = await self._tokenizer_pool.encode(text)
        if not token_ids:
            raise InvalidArgumentError("text", "encodes to no tokens")
        return token_ids, ()

    async def generate(self, request: GenerateInput, timeout_s: float | None) -> AsyncGenerator[CompletionChunk, None]:
        """The call's chunks, completions interleaved, in a "generate" span with the GenAI request and usage
        attributes (child of the gRPC SERVER span); raises pdserve errors (or a pod's AioRpcError).
        NOTE: one generator layer between the servicer and the completions (each layer costs every message of the
        stream a resumption)."""
        arrival = self._ctx.clock()
        params = request.params
        admission = self._ctx.admission
        with (
            self._ctx.tracing.span("generate", _span_attributes(request, self._model.model_id)) as span,
            self.running.running(request.request_id),
        ):
            ticket = admission.enter(request.client_id, timeout_s)
            try:
                token_ids, completions = await self._start(request, ticket, arrival, timeout_s)
                finish_reasons: list[str] = []
                num_completion_tokens = 0
                num_cached_tokens = len(token_ids)
                async with contextlib.aclosing(completions) as chunks:
                    async for chunk in chunks:
                        admission.start(ticket)
                        num_completion_tokens += len(chunk.token_ids)
                        if chunk.finish_reason is not None:
                            finish_reasons.append(chunk.finish_reason)
                            # NOTE: each completion prefilled the prompt; report what every one of them reused.
                            num_cached_tokens = min(num_cached_tokens, chunk.num_cached_tokens)
                            if len(finish_reasons) == params.n:
                                usage = Usage(len(token_ids), num_completion_tokens, num_cached_tokens)
                                chunk = dataclasses.replace(chunk, usage=usage)
                                span.set_attributes(
                                    {
                                        GEN_AI_USAGE_INPUT_TOKENS: usage.prompt_tokens,
                                        GEN_AI_USAGE_OUTPUT_TOKENS: usage.completion_tokens,
                                        GEN_AI_RESPONSE_FINISH_REASONS: finish_reasons,
                                    }
                                )
                        yield chunk
            finally:
                admission.leave(ticket)

    async def _start(
        self, request: GenerateInput, ticket: Ticket, arrival: float, timeout_s: float | None
    ) -> tuple[list[int], AsyncGenerator[CompletionChunk, None]]:
        """Check and tokenize the call, wait for its turn in the router's queue, plan it; its prompt's token ids and
        its completions' chunks."""
        params = request.params
        self._checks.check_ids(request.request_id, request.cache_salt)
        self._checks.check_params(params)
        with self._ctx.tracing.span("tokenize") as span:
            token_ids, images = await self._prompt_token_ids(request)
            span.set_attribute(GEN_AI_USAGE_INPUT_TOKENS, len(token_ids))
        self._checks.check_length(_prompt_field(request), len(token_ids), params.max_tokens)
        deadline = None if timeout_s is None else arrival + timeout_s
        with self._ctx.tracing.span("queue"):
            await self._ctx.admission.admit(ticket, len(token_ids) * params.n, arrival, deadline)
        plan = await self._plan(request, token_ids, images, arrival, deadline)
        return token_ids, self._completions(plan, params)

    def _completions(self, plan: PromptPlan, params: SamplingParams) -> AsyncGenerator[CompletionChunk, None]:
        """The call's completions, merged: n runs, or best_of of which the n best come back, or one beam search."""
        if params.use_beam_search:
            return BeamSearchRun(self._ctx, plan, 0, params).run()
        sampled = params if params.num_samples == params.n else sample_params(params)
        runs = [
            CompletionRun(self._ctx, plan, index, _completion_params(sampled, index)).run()
            for index in range(params.num_samples)
        ]
        return _merged(runs) if params.num_samples == params.n else best_of(_merged(runs), params)

    async def _prompt_token_ids(self, request: GenerateInput) -> tuple[list[int], tuple[ImageInput, ...]]:
        if request.token_ids is None:
            return await self._tokenize_with_images(request.text, request.messages)
        if not request.token_ids:
            raise InvalidArgumentError("token_ids", "must not be empty")
        self._checks.check_length("token_ids", len(request.token_ids), request.params.max_tokens)
        vocab_size = self._model.vocab_size
        for position, token_id in enumerate(request.token_ids):
            if not 0 <= token_id < vocab_size:
                raise InvalidArgumentError(
                    "token_ids",
                    f"token id {token_id} at position {position} is outside the vocabulary [0, {vocab_size})",
                )
        return list(request.token_ids), ()

    async def _plan(
        self,
        request: GenerateInput,
        token_ids: list[int],
        images: tuple[ImageInput, ...],
        arrival: float,
        deadline: float | None,
    ) -> PromptPlan:
        extra_keys = block_extra_keys(self._model.model_id, request.cache_salt)
        # NOTE: hashed as the pods hash it: each image's placeholders stand for the image.
        hashed_ids = block_token_ids(token_ids, images) if images else token_ids
        block_hashes = hash_prompt_blocks(hashed_ids, self._model.block_size, extra_keys)
        # NOTE: a prompt shorter than a block has no block hash; its (partial) hash still sends equal
        # short prompts to one pod, though nothing of it is cached.
        routing_key = block_hashes[0] if block_hashes else hash_block_tokens(None, hashed_ids, extra_keys)
        cached_blocks: dict[str, float] = {}
        latency_s: float | None = None
        live = {pod.pod_id: pod.generation for pod in self._ctx.pods.pods("prefill")}
        # NOTE: with one live prefill pod there is no choice for the answer to change: no lookup (a Redis round trip).
        if block_hashes and len(live) > 1:
            started = time.perf_counter()
            cached_blocks = await self._directory.longest_prefix(block_hashes, live)
            latency_s = time.perf_counter() - started
            # NOTE: an answer names every live pod; {} means Redis failed (routing falls back to rendezvous).
            if cached_blocks:
                self._ctx.metrics.observe_directory_lookup(latency_s, any(cached_blocks.values()))
            else:
                self._ctx.metrics.count_directory_error()
        return PromptPlan(
            # NOTE: the tag keeps pod-side ids unique when callers reuse a request_id.
            request_id=f"{request.request_id}.{secrets.token_hex(4)}",
            token_ids=token_ids,
            routing_key=routing_key,
            cached_blocks=cached_blocks,
            cache_salt=request.cache_salt,
            arrival=arrival,
            deadline=deadline,
            directory_latency_s=latency_s,
            images=images,
        )


def _span_attributes(request: GenerateInput, model_id: str) -> dict[str, str | int | float]:
    params = request.params
    return {
        GEN_AI_OPERATION_NAME: GEN_AI_OPERATION_CHAT
        if request.messages is not None
        else GEN_AI_OPERATION_TEXT_COMPLETION,
        GEN_AI_REQUEST_MODEL: model_id,
        GEN_AI_REQUEST_MAX_TOKENS: params.max_tokens,
        GEN_AI_REQUEST_TEMPERATURE: params.temperature,
        GEN_AI_REQUEST_TOP_P: params.top_p,
        PDSERVE_REQUEST_ID: request.request_id,
    }


def _prompt_field(request: GenerateInput) -> str:
    if request.token_ids is not None:
        return "token_ids"
    return "messages" if request.messages is not None else "text"


def _completion_params(params: SamplingParams, index: int) -> SamplingParams:
    seed = completion_seed(params.seed, index)
    # NOTE: a lone completion's params are most calls' own: no copy (and no second validation) of them.
    if params.n == 1 and params.best_of is None and seed == params.seed:
        return params
    return dataclasses.replace(params, n=1, best_of=None, seed=seed)


def _merged(runs: list[AsyncGenerator[CompletionChunk, None]]) -> AsyncGenerator[CompletionChunk, None]:
    """The runs' chunks as they come (a lone run as it is: no layer between it and its consumer)."""
    return runs[0] if len(runs) == 1 else _interleaved(runs)


async def _interleaved(runs: list[AsyncGenerator[CompletionChunk, None]]) -> AsyncGenerator[CompletionChunk, None]:
    """The runs' chunks as they come. An error in one run ends the stream with that error; closing the
    stream (or an error) cancels every run still going."""
    queue: asyncio.Queue[CompletionChunk | BaseException | None] = asyncio.Queue()

    async def pump(run: AsyncGenerator[CompletionChunk, None]) -> None:
        try:
            async with contextlib.aclosing(run) as chunks:
                async for chunk in chunks:
                    queue.put_nowait(chunk)
        except Exception as exc:
            queue.put_nowait(exc)
        else:
            queue.put_nowait(None)

    tasks = [asyncio.create_task(pump(run), name="completion") for run in runs]
    try:
        num_running = len(tasks)
        while num_running:
            item = await queue.get()
            if item is None:
                num_running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
