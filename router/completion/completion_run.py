"""One completion of a Generate call, from picking pods to its last token, across as many legs as it takes.

1. Pick a prefill and a decode pod and open a leg on them (`router.completion.completion_leg`: Reserve + Prefill up to
   the first token). Its first token goes to the client at once; if it already ends the completion (the pod says so,
   the leg's max_tokens is 1, or a stop string matched), the leg is closed (its reservation Released); done.
2. Otherwise the leg decodes: each step is detokenized and streamed; a stop string match closes the leg (the
   Decode call is cancelled). The last chunk carries finish reason, stop reason and metrics.
3. A leg that fails (`LegFailed`: a pod died, reset the connection, lost the lease, or ended the stream unfinished)
   marks the pod it blames suspect (`PodView.report_unavailable`) and skips it for this completion; after a
   backoff, the completion goes on with a new leg (`router.completion.migration.next_leg`): the prompt plus every token
   emitted so far is the new prompt and max_tokens shrinks by them. The client sees one stream: the emitted token
   ids and the detokenizer carry over, so no token is repeated or lost. `max_attempts` failed legs, or an empty
   router-wide retry budget, end the completion UNAVAILABLE with a RetryInfo.
   A decode pod that ends a request mid-decode for want of KV blocks (`DecodeLegEnded`: an image prompt it could
   neither keep nor recompute) costs an attempt and a retry like a failed leg, but is skipped as full, not suspect.
   A decode pod out of KV blocks (`DecodePodFull`) is skipped at no cost to the budgets; when every decode pod
   is, the completion waits in the router's queue (`RouterAdmission.wait_for_room`, in its call's arrival order) until
   one may have room (the pods were read again, or a call ended, and the router's view shows free blocks for the
   prompt), then tries them again; past the wait's bound it fails RESOURCE_EXHAUSTED + RetryInfo.
4. A leg about to start while no prefill or no decode pod is live (they left after the call was admitted) waits in
   the same queue for one; past the wait's bound the completion fails UNAVAILABLE + RetryInfo.
Leaving early (an error, or the client's cancellation cancelling this generator) closes the open leg.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

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
from router.admission.wait_queue import WaitTimedOut
from router.completion.completion_leg import CompletionLeg, DecodeLegEnded, DecodePodFull, LegFailed
from router.completion.migration import BACKOFF_MAX_S, LegInput, backoff_s, next_leg
from router.completion.run_context import PromptPlan, RunContext
from router.outputs import CompletionChunk, CompletionMetrics, DecodeStep, FirstToken, TransferDone
from router.pods.routing_policy import pairable_prefill_pods, paired_decode_pods

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Progress:
    """What a completion has streamed so far, across its legs."""

    emitted: list[int] = field(default_factory=list)
    num_attempts: int = 0
    num_failures: int = 0
    first: FirstToken | None = None
    """The first leg's first token (its num_cached_tokens is the prompt's)."""
    time_to_first_token_s: float = 0.0
    time_to_first_decode_token_s: float | None = None
    skipped: dict[PodRole, set[str]] = field(default_factory=lambda: {"prefill": set(), "decode": set()})
    full: set[str] = field(default_factory=set)
    """The decode pods skipped because their Reserve found no free KV blocks (also in `skipped`)."""


class CompletionRun:
    """Runs completion `index` of a request; iterate `run()` once."""

    def __init__(self, context: RunContext, plan: PromptPlan, index: int, params: SamplingParams) -> None:
        self._ctx = context
        self._plan = plan
        self._index = index
        self._params = params
        self._request_id = f"{plan.request_id}.{index}"
        self._detokenizer = IncrementalDetokenizer(
            context.tokenizer, plan.token_ids, params.stop, params.include_stop_str_in_output
        )
        self._progress = _Progress()
        self._last_token_at = 0.0
        """When the leg's last token reached the router (each step's time per output token is measured from it)."""

    async def run(self) -> AsyncGenerator[CompletionChunk, None]:
        progress = self._progress
        while True:
            leg_input = next_leg(self._plan.token_ids, progress.emitted, self._params)
            if leg_input is None:
                # NOTE: a leg failed after its last token but before its finish reason arrived.
                yield self._last_chunk(DecodeStep((), (), "length"), self._detokenizer.flush(), None)
                return
            if not self._pods_live() or self._every_decode_pod_full():
                await self._wait_for_room(leg_input)
            progress.num_attempts += 1
            leg = self._leg(leg_input)
            try:
                first, opening = await self._open(leg, leg_input)
                for chunk in opening:
                    yield chunk
                if chunk.finish_reason is None:
                    # NOTE: the decode steps come straight from the leg (a coroutine per step, no generator layer).
                    leg.start_decode(first.token_id)
                    self._last_token_at = self._ctx.clock()
                    while chunk.finish_reason is None:
                        chunk = await self._next_chunk(leg)
                        yield chunk
                return
            except DecodeLegEnded as ended:
                await self._after_failure(leg, ended)
            except DecodePodFull:
                self._skip_full_decode_pod(leg.decode_pod.pod_id)
            except LegFailed as failure:
                await self._after_failure(leg, failure)
            finally:
                await leg.aclose()

    async def _open(self, leg: CompletionLeg, leg_input: LegInput) -> tuple[FirstToken, list[CompletionChunk]]:
        """Open the leg up to its first token; that token and the client's chunks up to it (one: the token's); the
        leg decodes on unless the last one finishes the completion."""
        first = await leg.open()
        if self._progress.first is None:
            self._progress.first = first
            self._progress.time_to_first_token_s = self._elapsed()
            self._ctx.metrics.observe_first_token(self._progress.time_to_first_token_s, len(self._plan.token_ids))
        logprobs = () if first.logprob is None else (first.logprob,)
        step = DecodeStep((first.token_id,), logprobs, first.finish_reason, first.stop_reason)
        if step.finish_reason is None and leg_input.params.max_tokens == 1:
            step = DecodeStep(step.token_ids, step.logprobs, "length")
        return first, [self._chunk(step, leg)]

    async def _next_chunk(self, leg: CompletionLeg) -> CompletionChunk:
        """The client's chunk of the leg's next decode step; the last one (with the transfer's figures) when it
        finishes the completion."""
        step = await leg.next_step()
        if self._progress.time_to_first_decode_token_s is None:
            self._progress.time_to_first_decode_token_s = self._elapsed()
        now = self._ctx.clock()
        self._ctx.metrics.observe_output_tokens(len(step.token_ids), now - self._last_token_at)
        self._last_token_at = now
        chunk = self._chunk(step, leg)
        if chunk.finish_reason is None:
            return chunk
        leg.finished()
        return dataclasses.replace(chunk, metrics=self._metrics(leg, await leg.transfer_result()))

    def _chunk(self, step: DecodeStep, leg: CompletionLeg) -> CompletionChunk:
        """The client's chunk of `step` (its tokens now count as emitted); the last one when it finishes."""
        out, num_used = self._detokenizer.update_each(step.token_ids)
        if num_used < len(step.token_ids):
            step = DecodeStep(step.token_ids[:num_used], step.logprobs[:num_used], step.finish_reason, step.stop_reason)
        self._progress.emitted.extend(step.token_ids)
        if out.stop_reason is not None:
            # NOTE: the stop string's text is cut; the caller closes the leg, which cancels its Decode call.
            return self._last_chunk(
                DecodeStep(step.token_ids, step.logprobs, "stop", out.stop_reason),
                out.text_delta,
                self._metrics(leg, None),
            )
        if step.finish_reason is None:
            return CompletionChunk(self._index, out.text_delta, step.token_ids, step.logprobs)
        return self._last_chunk(step, out.text_delta + self._detokenizer.flush(), self._metrics(leg, None))

    def _last_chunk(self, step: DecodeStep, text: str, metrics: CompletionMetrics | None) -> CompletionChunk:
        assert step.finish_reason is not None
        progress = self._progress
        elapsed = self._elapsed()
        decode_s = None if progress.time_to_first_decode_token_s is None else elapsed - progress.time_to_first_token_s
        self._ctx.metrics.observe_finished(step.finish_reason, elapsed, len(progress.emitted), decode_s=decode_s)
        num_cached_tokens = 0 if progress.first is None else progress.first.num_cached_tokens
        return CompletionChunk(
            self._index,
            text,
            step.token_ids,
            step.logprobs,
            step.finish_reason,
            step.stop_reason,
            metrics,
            num_cached_tokens=num_cached_tokens,
        )

    def _metrics(self, leg: CompletionLeg, done: TransferDone | None) -> CompletionMetrics:
        progress = self._progress
        return CompletionMetrics(
            prefill_pod_id=leg.prefill_pod.pod_id,
            decode_pod_id=leg.decode_pod.pod_id,
            num_attempts=progress.num_attempts,
            time_to_first_token_s=progress.time_to_first_token_s,
            time_to_first_decode_token_s=progress.time_to_first_decode_token_s,
            kv_transfer_bytes=0 if done is None else done.num_bytes,
            kv_transfer_duration_s=0.0 if done is None else done.duration_s,
        )

    async def _after_failure(self, leg: CompletionLeg, failure: LegFailed | DecodeLegEnded) -> None:
        """Mark the blamed pod (a failed leg's) or skip the full decode pod (a leg it ended), then wait out the
        backoff; raises UnavailableError once a budget is spent."""
        progress = self._progress
        progress.num_failures += 1
        if isinstance(failure, DecodeLegEnded):
            progress.skipped["decode"].add(leg.decode_pod.pod_id)
            progress.full.add(leg.decode_pod.pod_id)
        else:
            self._ctx.pods.report_unavailable(failure.pod_id)
            role: PodRole = "decode" if failure.pod_id == leg.decode_pod.pod_id else "prefill"
            progress.skipped[role].add(failure.pod_id)
        logger.warning(
            "request %s: attempt %d failed after %d tokens: %s",
            self._request_id,
            progress.num_attempts,
            len(progress.emitted),
            failure,
        )
        if progress.num_failures >= self._ctx.max_attempts:
            message = f"{progress.num_failures} attempts failed, the last: {failure}"
            raise UnavailableError(message, retry_after_s=BACKOFF_MAX_S) from None
        if not self._ctx.retry_budget.try_acquire():
            raise UnavailableError(
                f"the router's retry budget is spent; the last failure: {failure}",
                retry_after_s=self._ctx.retry_budget.retry_after_s(),
            ) from None
        self._ctx.metrics.count_router_retry()
        await asyncio.sleep(backoff_s(progress.num_failures, self._ctx.rng))

    def _skip_full_decode_pod(self, pod_id: str) -> None:
        self._progress.skipped["decode"].add(pod_id)
        self._progress.full.add(pod_id)
        self._ctx.metrics.count_router_retry()

    def _every_decode_pod_full(self) -> bool:
        """Whether this completion found every live decode pod full (or failed) since it last waited for room."""
        skipped = self._progress.skipped["decode"]
        return bool(self._progress.full) and all(pod.pod_id in skipped for pod in self._ctx.pods.pods("decode"))

    def _pods_live(self) -> bool:
        return bool(self._ctx.pods.pods("prefill")) and bool(self._ctx.pods.pods("decode"))

    async def _wait_for_room(self, leg_input: LegInput) -> None:
        """Wait in the router's queue until both roles have a live pod and, after every decode pod was found full,
        the router's view shows one with free blocks for the leg's prompt; the full pods are then tried again."""
        full = self._progress.full
        num_blocks = -(-len(leg_input.token_ids) // self._ctx.block_size)

        def has_room() -> bool:
            if not self._pods_live():
                return False
            load = self._ctx.load.get
            free = (pod.num_free_blocks - load(pod.pod_id).num_reserved_blocks for pod in self._ctx.pods.pods("decode"))
            return not full or any(num_free >= num_blocks for num_free in free)

        admission = self._ctx.admission
        try:
            await admission.wait_for_room(self._plan.arrival, self._plan.deadline, has_room)
        except WaitTimedOut:
            if full and self._pods_live():
                raise ResourceExhaustedError(
                    "every decode pod is out of KV blocks", retry_after_s=admission.retry_after_s()
                ) from None
            role = "decode" if self._ctx.pods.pods("prefill") else "prefill"
            raise UnavailableError(f"no {role} pod is available", retry_after_s=admission.retry_after_s()) from None
        self._progress.skipped["decode"] -= full
        full.clear()

    def _leg(self, leg_input: LegInput) -> CompletionLeg:
        """A new leg on the pods picked for it, in a "route" span naming them, the cached prefix and the directory's
        latency."""
        attempt = self._progress.num_attempts
        with self._ctx.tracing.span("route", {PDSERVE_ROUTE_ATTEMPT: attempt}) as span:
            prefill_pod, decode_pod = self._pick(leg_input)
            cached_tokens = int(self._plan.cached_blocks.get(prefill_pod.pod_id, 0) * self._ctx.block_size)
            span.set_attributes(
                {
                    PDSERVE_PREFILL_POD: prefill_pod.pod_id,
                    PDSERVE_DECODE_POD: decode_pod.pod_id,
                    PDSERVE_CACHED_PREFIX_TOKENS: cached_tokens,
                }
            )
            if self._plan.directory_latency_s is not None:
                span.set_attribute(PDSERVE_DIRECTORY_LATENCY_S, self._plan.directory_latency_s)
        request_id = f"{self._request_id}.{attempt}"
        return CompletionLeg(self._ctx, self._plan, request_id, leg_input, prefill_pod, decode_pod)

    def _pick(self, leg_input: LegInput) -> tuple[PodInfo, PodInfo]:
        """A prefill pod, then a decode pod of its parallel sizes (KV moves rank to rank). NOTE: where no pair of
        equal sizes is live, any pair is tried: its prefill pod refuses the KV target, naming both sizes."""
        load = self._ctx.load.get
        decode_pods = self._eligible("decode")
        prefill_pod = self._ctx.policy.pick_prefill(
            pairable_prefill_pods(self._eligible("prefill"), decode_pods),
            self._plan.routing_key,
            self._plan.cached_blocks,
            load,
        )
        decode_pod = self._ctx.policy.pick_decode(
            paired_decode_pods(decode_pods, prefill_pod), len(leg_input.token_ids), leg_input.params.max_tokens, load
        )
        return prefill_pod, decode_pod

    def _eligible(self, role: PodRole) -> list[PodInfo]:
        """The role's pods this completion has not skipped; all of them when it skipped every one (a pod that
        failed once may serve again, and UNAVAILABLE only comes from the policy when no pod is left)."""
        pods = self._ctx.pods.pods(role)
        skipped = self._progress.skipped[role]
        return [pod for pod in pods if pod.pod_id not in skipped] or pods

    def _elapsed(self) -> float:
        return self._ctx.clock() - self._plan.arrival
