"""One completion of a Generate call, from picking pods to its last token.

1. Open (retried): pick a prefill and a decode pod; Reserve the prompt's KV blocks on the decode
   pod; start Prefill with that KV target and wait for its first message, the first token. A pod
   answering UNAVAILABLE before that (gone or draining) is skipped and the attempt repeated on
   another (at most `max_attempts` such failures); a decode pod out of KV blocks is skipped too,
   and when every decode pod is, the completion fails with RESOURCE_EXHAUSTED.
2. The first token goes to the client at once. If it already ends the completion (the pod says so,
   max_tokens is 1, or a stop string matched), the Prefill call is cancelled and the reservation
   Released; done.
3. Otherwise Decode is called on the reserving pod, while the rest of the Prefill stream (the KV
   transfer's end) is read beside it. Each decode step is detokenized; a stop string match cancels
   the Decode call. The last chunk carries finish reason, stop reason and metrics.
Leaving early (an error, or the client's cancellation cancelling this generator) cancels whatever
pod calls are open and Releases a reservation that no Decode claimed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from common.detokenizer import IncrementalDetokenizer
from common.errors import ResourceExhaustedError, UnavailableError
from common.pod_registry import PodInfo, PodRole
from common.sampling_params import SamplingParams
from common.telemetry import (
    PDSERVE_CACHED_PREFIX_TOKENS,
    PDSERVE_DECODE_POD,
    PDSERVE_DIRECTORY_LATENCY_S,
    PDSERVE_PREFILL_POD,
    PDSERVE_ROUTE_ATTEMPT,
)
from kv_transfer.target import KVTarget
from router.outputs import CompletionChunk, CompletionMetrics, FinishReason, FirstToken, TransferDone
from router.pod_client import PodClient
from router.prefill_tail import cancel_and_wait, result_within, transfer_done, until_transfer_fails
from router.run_context import PromptPlan, RunContext

logger = logging.getLogger(__name__)

_RELEASE_TIMEOUT_S = 2.0
_TRANSFER_DONE_WAIT_S = 1.0
_RELEASING: set[asyncio.Task[None]] = set()


@dataclass(slots=True)
class _Reserved:
    """KV blocks reserved on a decode pod; `claimed` once a Decode call ended with them.

    NOTE: not when Decode is called: a call cancelled before it reached the pod leaves the reservation unclaimed there
    (its lease would hold the blocks); a Release of a reservation that Decode did claim is a no-op on the pod.
    """

    decode_client: PodClient
    target: KVTarget
    claimed: bool = False


@dataclass(slots=True, frozen=True)
class _Leg:
    """An opened completion: its pods, reservation, Prefill stream and first token."""

    prefill_pod_id: str
    reserved: _Reserved
    prefill_stream: AsyncGenerator[FirstToken | TransferDone, None]
    first: FirstToken
    num_attempts: int


class _AttemptFailed(Exception):
    """A pod answered UNAVAILABLE before the first token: try another."""

    def __init__(self, pod_id: str, error: UnavailableError) -> None:
        super().__init__(str(error))
        self.pod_id = pod_id


class _DecodePodFull(Exception):
    """A decode pod's Reserve found no free KV blocks: try another decode pod."""


class CompletionRun:
    """Runs completion `index` of a request; iterate `run()` once."""

    def __init__(self, context: RunContext, plan: PromptPlan, index: int, params: SamplingParams) -> None:
        self._ctx = context
        self._plan = plan
        self._index = index
        self._params = params
        self._request_id = f"{plan.request_id}.{index}"

    async def run(self) -> AsyncGenerator[CompletionChunk, None]:
        async with contextlib.AsyncExitStack() as stack:
            leg = await self._open(stack)
            first = leg.first
            detokenizer = IncrementalDetokenizer(
                self._ctx.tokenizer, self._plan.token_ids, self._params.stop, self._params.include_stop_str_in_output
            )
            step = detokenizer.update([first.token_id])
            finish, stop = first.finish_reason, first.stop_reason
            if step.stop_reason is not None:
                finish, stop = "stop", step.stop_reason
            elif finish is None and self._params.max_tokens == 1:
                finish = "length"
            logprobs = () if first.logprob is None else (first.logprob,)
            time_to_first_token = self._elapsed()
            self._ctx.metrics.observe_first_token(time_to_first_token, len(self._plan.token_ids))
            if finish is not None:
                text = step.text_delta if step.stop_reason is not None else step.text_delta + detokenizer.flush()
                metrics = self._metrics(leg, time_to_first_token, None, None)
                self._ctx.metrics.observe_finished(finish, self._elapsed(), 1)
                yield self._last_chunk(text, (first.token_id,), logprobs, finish, stop, metrics, first)
                return
            yield CompletionChunk(self._index, step.text_delta, (first.token_id,), logprobs)
            async with contextlib.aclosing(self._decode(stack, leg, detokenizer, time_to_first_token)) as chunks:
                async for chunk in chunks:
                    yield chunk

    async def _open(self, stack: contextlib.AsyncExitStack) -> _Leg:
        """Reserve + Prefill until a first token, retrying on other pods; see the module docstring."""
        skipped_prefill: set[str] = set()
        skipped_decode: set[str] = set()
        num_failures = 0
        attempt = 0
        while True:
            attempt += 1
            prefill_pod, decode_pod = self._route(skipped_prefill, skipped_decode, attempt)
            try:
                leg, cleanup = await self._attempt(prefill_pod, decode_pod, attempt)
            except _DecodePodFull:
                skipped_decode.add(decode_pod.pod_id)
                if not self._eligible("decode", skipped_decode):
                    raise ResourceExhaustedError("every decode pod is out of KV blocks") from None
                self._ctx.metrics.count_router_retry()
                continue
            except _AttemptFailed as failure:
                self._ctx.pods.report_unavailable(failure.pod_id)
                (skipped_decode if failure.pod_id == decode_pod.pod_id else skipped_prefill).add(failure.pod_id)
                num_failures += 1
                logger.warning("request %s: attempt %d failed: %s", self._request_id, attempt, failure)
                if num_failures >= self._ctx.max_attempts:
                    raise UnavailableError(f"{num_failures} attempts failed, the last: {failure}") from None
                self._ctx.metrics.count_router_retry()
                continue
            stack.push_async_exit(cleanup)
            return leg

    def _route(self, skipped_prefill: set[str], skipped_decode: set[str], attempt: int) -> tuple[PodInfo, PodInfo]:
        """`_pick` in a "route" span naming the chosen pods, the cached prefix and the directory's latency."""
        with self._ctx.tracing.span("route", {PDSERVE_ROUTE_ATTEMPT: attempt}) as span:
            prefill_pod, decode_pod = self._pick(skipped_prefill, skipped_decode)
            cached_tokens = self._plan.cached_blocks.get(prefill_pod.pod_id, 0) * self._ctx.block_size
            span.set_attributes(
                {
                    PDSERVE_PREFILL_POD: prefill_pod.pod_id,
                    PDSERVE_DECODE_POD: decode_pod.pod_id,
                    PDSERVE_CACHED_PREFIX_TOKENS: cached_tokens,
                }
            )
            if self._plan.directory_latency_s is not None:
                span.set_attribute(PDSERVE_DIRECTORY_LATENCY_S, self._plan.directory_latency_s)
        return prefill_pod, decode_pod

    def _pick(self, skipped_prefill: set[str], skipped_decode: set[str]) -> tuple[PodInfo, PodInfo]:
        load = self._ctx.load.get
        prefill_pod = self._ctx.policy.pick_prefill(
            self._eligible("prefill", skipped_prefill), self._plan.routing_key, self._plan.cached_blocks, load
        )
        decode_pod = self._ctx.policy.pick_decode(
            self._eligible("decode", skipped_decode), len(self._plan.token_ids), self._params.max_tokens, load
        )
        return prefill_pod, decode_pod

    def _eligible(self, role: PodRole, skipped: set[str]) -> list[PodInfo]:
        return [pod for pod in self._ctx.pods.pods(role) if pod.pod_id not in skipped]

    async def _attempt(
        self, prefill_pod: PodInfo, decode_pod: PodInfo, attempt: int
    ) -> tuple[_Leg, contextlib.AsyncExitStack]:
        """One Reserve + Prefill; on success the leg and the stack that closes it (Release included)."""
        request_id = f"{self._request_id}.{attempt}"
        num_prompt_tokens = len(self._plan.token_ids)
        stack = contextlib.AsyncExitStack()
        try:
            decode_client = self._ctx.pods.client(decode_pod)
            # NOTE: counted from the pick, not from Reserve's answer, so that a burst of completions picking pods
            # at once spreads over the decode pods instead of all seeing the same idle one.
            num_blocks = -(-num_prompt_tokens // self._ctx.block_size)
            stack.enter_context(self._ctx.load.decoding(decode_pod.pod_id, num_blocks))
            reserving = asyncio.ensure_future(
                decode_client.reserve(request_id, num_prompt_tokens, self._params.max_tokens, self._remaining())
            )
            try:
                target = await asyncio.shield(reserving)
            except asyncio.CancelledError:
                # NOTE: cancelled mid-Reserve: the pod may reserve all the same; Release it once Reserve answers.
                reserving.add_done_callback(lambda done: self._release_reserved(decode_client, done))
                raise
            except UnavailableError as exc:
                raise _AttemptFailed(decode_pod.pod_id, exc) from exc
            except ResourceExhaustedError as exc:
                # NOTE: only Reserve's; a prefill pod's RESOURCE_EXHAUSTED (overload) reaches the client as it is.
                raise _DecodePodFull(str(exc)) from exc
            reserved = _Reserved(decode_client, target)
            stack.push_async_callback(lambda: asyncio.shield(self._release_in_background(reserved)))
            prefill_stream = self._ctx.pods.client(prefill_pod).prefill(
                request_id, self._plan.token_ids, self._params, target, self._plan.cache_salt, self._remaining()
            )
            stack.push_async_callback(prefill_stream.aclose)
            cached_tokens = self._plan.cached_blocks.get(prefill_pod.pod_id, 0) * self._ctx.block_size
            with self._ctx.load.prefilling(prefill_pod.pod_id, max(num_prompt_tokens - cached_tokens, 0)):
                try:
                    first = await anext(prefill_stream, None)
                except UnavailableError as exc:
                    raise _AttemptFailed(prefill_pod.pod_id, exc) from exc
            if not isinstance(first, FirstToken):
                raise UnavailableError(f"prefill pod {prefill_pod.pod_id} sent no first token")
        except BaseException:
            await stack.aclose()
            raise
        return _Leg(prefill_pod.pod_id, reserved, prefill_stream, first, attempt), stack

    async def _decode(
        self, stack: contextlib.AsyncExitStack, leg: _Leg, detokenizer: IncrementalDetokenizer, ttft: float
    ) -> AsyncGenerator[CompletionChunk, None]:
        transfer = asyncio.create_task(transfer_done(leg.prefill_stream), name=f"transfer-{self._request_id}")
        stack.push_async_callback(cancel_and_wait, transfer)
        decode_client = leg.reserved.decode_client
        steps = decode_client.decode(
            f"{self._request_id}.{leg.num_attempts}", leg.reserved.target.transfer_id, self._plan.token_ids,
            leg.first.token_id, self._params, self._plan.cache_salt, self._remaining(),
        )  # fmt: skip
        stack.push_async_callback(steps.aclose)
        first_decode_token_s: float | None = None
        num_output_tokens = 1
        last_token_at = self._ctx.clock()
        async with contextlib.aclosing(until_transfer_fails(steps, transfer)) as checked_steps:
            async for step in checked_steps:
                if first_decode_token_s is None:
                    first_decode_token_s = self._elapsed()
                now = self._ctx.clock()
                num_output_tokens += len(step.token_ids)
                self._ctx.metrics.observe_output_tokens(len(step.token_ids), now - last_token_at)
                last_token_at = now
                out = detokenizer.update(step.token_ids)
                finish, stop = step.finish_reason, step.stop_reason
                if out.stop_reason is not None:
                    finish, stop = "stop", out.stop_reason
                    await steps.aclose()
                if finish is None:
                    yield CompletionChunk(self._index, out.text_delta, step.token_ids, step.logprobs)
                    continue
                text = out.text_delta if out.stop_reason is not None else out.text_delta + detokenizer.flush()
                leg.reserved.claimed = True
                done = await result_within(transfer, _TRANSFER_DONE_WAIT_S)
                metrics = self._metrics(leg, ttft, first_decode_token_s, done)
                elapsed = self._elapsed()
                self._ctx.metrics.observe_finished(finish, elapsed, num_output_tokens, decode_s=elapsed - ttft)
                yield self._last_chunk(text, step.token_ids, step.logprobs, finish, stop, metrics, leg.first)
                return
        raise UnavailableError(f"decode pod {decode_client.pod_id} ended the stream without a finish reason")

    def _last_chunk(
        self, text: str, token_ids: tuple[int, ...], logprobs: tuple[float, ...], finish: FinishReason,
        stop: str | int | None, metrics: CompletionMetrics, first: FirstToken,
    ) -> CompletionChunk:  # fmt: skip
        return CompletionChunk(
            self._index, text, token_ids, logprobs, finish, stop, metrics, num_cached_tokens=first.num_cached_tokens
        )

    def _metrics(
        self, leg: _Leg, ttft: float, time_to_first_decode_token: float | None, done: TransferDone | None
    ) -> CompletionMetrics:
        return CompletionMetrics(
            prefill_pod_id=leg.prefill_pod_id,
            decode_pod_id=leg.reserved.decode_client.pod_id,
            num_attempts=leg.num_attempts,
            time_to_first_token_s=ttft,
            time_to_first_decode_token_s=time_to_first_decode_token,
            kv_transfer_bytes=0 if done is None else done.num_bytes,
            kv_transfer_duration_s=0.0 if done is None else done.duration_s,
        )

    def _release_reserved(self, decode_client: PodClient, reserving: asyncio.Future[KVTarget]) -> None:
        if not reserving.cancelled() and reserving.exception() is None:
            self._release_in_background(_Reserved(decode_client, reserving.result()))

    def _release_in_background(self, reserved: _Reserved) -> asyncio.Task[None]:
        """Release on a task of its own, so that a second cancellation of this one cannot strand the reservation."""
        task = asyncio.create_task(self._release_unclaimed(reserved), name=f"release-{self._request_id}")
        _RELEASING.add(task)
        task.add_done_callback(_RELEASING.discard)
        return task

    async def _release_unclaimed(self, reserved: _Reserved) -> None:
        """Release the reservation unless a Decode call claimed it (best effort: it lapses anyway)."""
        if reserved.claimed:
            return
        try:
            await reserved.decode_client.release(reserved.target.transfer_id, _RELEASE_TIMEOUT_S)
        except Exception as exc:
            logger.warning(
                "request %s: Release on %s failed (the reservation will lapse): %s",
                self._request_id,
                reserved.decode_client.pod_id,
                exc,
            )

    def _elapsed(self) -> float:
        return self._ctx.clock() - self._plan.arrival

    def _remaining(self) -> float | None:
        if self._plan.deadline is None:
            return None
        return max(self._plan.deadline - self._ctx.clock(), 0.0)
