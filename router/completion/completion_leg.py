"""One leg of a completion: Reserve + Prefill + Decode on one pair of pods.

1. `open`: Reserve the prompt's KV blocks on the decode pod (counted on it from the pick), start Prefill with that
   KV target, and wait for the Prefill stream's first message, the first token.
2. `start_decode`: decode the request on the reserving pod's DecodeStream (the reservation counts as claimed once the
   completion `finished`), while the rest of the Prefill stream (the KV transfer's end) is read beside it; a transfer
   that fails fails the decode too (the pod would wait for blocks that never come). `next_step` gives the decode
   steps (each holds every token that arrived since the last) up to the one with a finish reason.
3. `aclose`: cancel whatever pod call or decode is still open and Release a reservation that no decode claimed, on a
   task of its own so that a second cancellation cannot strand it; a leg cancelled mid-Reserve Releases what the pod
   reserved once Reserve answers.
A KV target answered under another generation than the decode pod's listed one (the pod restarted under the same
id and address) fails the leg: a reference is only ever used with the incarnation that made it.
A pod call failing in a way another pair of pods could fix raises `LegFailed`, naming the pod to blame: the pod
is unavailable (gone, draining, its keepalive lapsed) or its call failed (`router.pods.pod_errors.PodCallFailed`: a KV
transfer or reservation that ended, e.g. its lease lapsed, which from the Prefill stream blames the decode pod,
whose receiver stopped answering; or the peer went away mid-call). A decode pod out of KV blocks raises
`DecodePodFull`; one that ends the request mid-decode for want of KV blocks (RESOURCE_EXHAUSTED on its stream)
raises `DecodeLegEnded`. Anything else (bad input, overload, the client's deadline) propagates as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, Iterator

from common.errors import ResourceExhaustedError, UnavailableError
from common.pod_registry import PodInfo
from common.sampling_params import SamplingParams
from kv_transfer.target import KVTarget
from router.completion.migration import LegInput
from router.completion.prefill_tail import cancel_and_wait, result_within, transfer_done
from router.completion.run_context import PromptPlan, RunContext
from router.outputs import DecodeRequest, DecodeStep, FirstToken, TransferDone
from router.pods.decode_stream import DecodeCollector
from router.pods.pod_errors import PodCallFailed

logger = logging.getLogger(__name__)

_RELEASE_TIMEOUT_S = 2.0
_TRANSFER_DONE_WAIT_S = 1.0
_RELEASING: set[asyncio.Task[None]] = set()


def _prefill_params(params: SamplingParams) -> SamplingParams:
    """A beam search runs on the decode pod: its prefill pod computes the prompt's KV (its first token unused)."""
    if not params.use_beam_search:
        return params
    return dataclasses.replace(params, n=1, best_of=None, use_beam_search=False, ignore_eos=True)


class LegFailed(Exception):
    """A pod call of the leg failed in a way another pair of pods could fix; `pod_id` is the pod to blame."""

    def __init__(self, pod_id: str, message: str) -> None:
        super().__init__(message)
        self.pod_id = pod_id


class DecodePodFull(Exception):
    """A decode pod's Reserve found no free KV blocks: try another decode pod."""


class DecodeLegEnded(DecodePodFull):
    """A decode pod ended the request mid-decode with RESOURCE_EXHAUSTED: its KV pool was full and the request could
    not wait there (an image prompt, which only its prefill pod can compute: `engine.scheduler`). Another leg
    prefills again, images included, and decodes on another pod; unlike a full Reserve, it costs a prefill."""


@contextlib.contextmanager
def blamed_on(pod_id: str, transfer_peer_id: str | None = None) -> Iterator[None]:
    """Re-raises the pod call failures that end a leg (see the module docstring) as LegFailed(pod_id), or
    LegFailed(transfer_peer_id) for a KV transfer's failure when the call names the transfer's other end."""
    try:
        yield
    except UnavailableError as exc:
        raise LegFailed(pod_id, str(exc)) from exc
    except PodCallFailed as exc:
        blamed = transfer_peer_id if transfer_peer_id is not None and exc.transfer else pod_id
        raise LegFailed(blamed, str(exc)) from exc


class CompletionLeg:
    """One Reserve + Prefill + Decode of `leg_input` on `prefill_pod` and `decode_pod`; see the module docstring."""

    def __init__(
        self,
        context: RunContext,
        plan: PromptPlan,
        request_id: str,
        leg_input: LegInput,
        prefill_pod: PodInfo,
        decode_pod: PodInfo,
    ) -> None:
        self._ctx = context
        self._plan = plan
        self.request_id = request_id
        self._input = leg_input
        self.prefill_pod = prefill_pod
        self.decode_pod = decode_pod
        self._stack = contextlib.AsyncExitStack()
        self._target: KVTarget | None = None
        self._claimed = False
        self._prefill_stream: AsyncGenerator[FirstToken | TransferDone, None] | None = None
        self._transfer: asyncio.Task[TransferDone | None] | None = None
        self._collector: DecodeCollector | None = None

    async def open(self) -> FirstToken:
        """Reserve + Prefill up to the first token; raises LegFailed or DecodePodFull (see the module docstring)."""
        num_prompt_tokens = len(self._input.token_ids)
        decode_client = self._ctx.pods.client(self.decode_pod)
        # NOTE: counted from the pick, not from Reserve's answer, so that a burst of completions picking pods
        # at once spreads over the decode pods instead of all seeing the same idle one.
        num_blocks = -(-num_prompt_tokens // self._ctx.block_size)
        self._stack.enter_context(self._ctx.load.decoding(self.decode_pod.pod_id, num_blocks))
        timeout = self._ctx.remaining_s(self._plan.deadline)
        reserving = asyncio.ensure_future(
            decode_client.reserve(self.request_id, num_prompt_tokens, self._input.params.max_tokens, timeout)
        )
        with blamed_on(self.decode_pod.pod_id):
            try:
                self._target = await asyncio.shield(reserving)
            except asyncio.CancelledError:
                # NOTE: cancelled mid-Reserve: the pod may reserve all the same; Release it once Reserve answers.
                reserving.add_done_callback(self._release_when_reserved)
                raise
            except ResourceExhaustedError as exc:
                # NOTE: only Reserve's; a prefill pod's RESOURCE_EXHAUSTED (overload) reaches the client as it is.
                raise DecodePodFull(str(exc)) from exc
        self._stack.push_async_callback(self._release_unless_claimed)
        self._check_generation(self._target)
        stream = self._ctx.pods.client(self.prefill_pod).prefill(
            self.request_id,
            self._input.token_ids,
            _prefill_params(self._input.params),
            self._target,
            self._plan.cache_salt,
            self._ctx.remaining_s(self._plan.deadline),
            self._plan.images,
        )
        self._prefill_stream = stream
        self._stack.push_async_callback(stream.aclose)
        cached_tokens = int(self._plan.cached_blocks.get(self.prefill_pod.pod_id, 0) * self._ctx.block_size)
        num_to_compute = max(num_prompt_tokens - cached_tokens, 0)
        with (
            self._ctx.load.prefilling(self.prefill_pod.pod_id, num_to_compute),
            blamed_on(self.prefill_pod.pod_id, self.decode_pod.pod_id),
        ):
            first = await anext(stream, None)
        if not isinstance(first, FirstToken):
            raise LegFailed(self.prefill_pod.pod_id, f"prefill pod {self.prefill_pod.pod_id} sent no first token")
        return first

    def start_decode(self, first_token_id: int) -> None:
        """Decode the request on the reserving pod's DecodeStream from the second token on; take its steps with
        `next_step`."""
        assert self._target is not None and self._prefill_stream is not None
        client = self._ctx.pods.client(self.decode_pod)
        self._collector = collector = client.start_decode(
            DecodeRequest(
                self.request_id,
                self._target.transfer_id,
                self._input.token_ids,
                first_token_id,
                self._input.params,
                self._plan.cache_salt,
            )
        )
        self._stack.callback(client.cancel_decode, collector)
        self._transfer = asyncio.create_task(self._transfer_done(collector), name=f"transfer-{self.request_id}")
        self._stack.push_async_callback(cancel_and_wait, self._transfer)

    async def next_step(self) -> DecodeStep:
        """Every decode token that arrived since the last call (at least one), or the step with the finish reason;
        raises LegFailed. NOTE: a coroutine, not a generator: no layer between the DecodeStream's collector and the
        completion's consumer."""
        assert self._collector is not None
        try:
            return await self._collector.next_step()
        except (UnavailableError, PodCallFailed):
            # NOTE: blamed_on's classification, without a context manager's generator per step.
            with blamed_on(self.decode_pod.pod_id):
                raise
        except ResourceExhaustedError as exc:
            raise DecodeLegEnded(str(exc)) from exc

    def finished(self) -> None:
        """The completion ended on this leg's Decode (a finish reason, or a stop string the router matched): the pod
        claimed the reservation, so no Release follows. NOTE: not claimed when Decode is called: a call cancelled
        before it reached the pod leaves the reservation unclaimed there (a Release of a claimed one is a no-op)."""
        self._claimed = True

    async def transfer_result(self) -> TransferDone | None:
        """The KV transfer's TransferDone if it comes within a second of the call; None otherwise."""
        if self._transfer is None:
            return None
        return await result_within(self._transfer, _TRANSFER_DONE_WAIT_S)

    async def aclose(self) -> None:
        await self._stack.aclose()

    def _check_generation(self, target: KVTarget) -> None:
        """A target of another generation than the listed one comes from a restarted pod the router does not know
        yet: the leg is not built on it (NOTE: the pod is suspect until the registry lists its new generation)."""
        listed = self.decode_pod.generation
        if target.generation and listed and target.generation != listed:
            raise LegFailed(
                self.decode_pod.pod_id,
                f"decode pod {self.decode_pod.pod_id} reserved as generation {target.generation}, listed as {listed}",
            )

    async def _transfer_done(self, collector: DecodeCollector) -> TransferDone | None:
        """The rest of the Prefill stream; its failure fails the decode (as LegFailed naming the pod to blame)."""
        assert self._prefill_stream is not None
        try:
            with blamed_on(self.prefill_pod.pod_id, self.decode_pod.pod_id):
                return await transfer_done(self._prefill_stream)
        except LegFailed as failure:
            collector.fail(failure)
            raise

    def _release_when_reserved(self, reserving: asyncio.Future[KVTarget]) -> None:
        if not reserving.cancelled() and reserving.exception() is None:
            self._target = reserving.result()
            self._release_in_background()

    async def _release_unless_claimed(self) -> None:
        """The leg's close: Release an unclaimed reservation (on a task of its own, see the module docstring); a claimed
        one (the common case) needs no task at all."""
        if not self._claimed:
            await asyncio.shield(self._release_in_background())

    def _release_in_background(self) -> asyncio.Task[None]:
        task = asyncio.create_task(self._release_unclaimed(), name=f"release-{self.request_id}")
        _RELEASING.add(task)
        task.add_done_callback(_RELEASING.discard)
        return task

    async def _release_unclaimed(self) -> None:
        """Release the reservation unless a Decode call claimed it (best effort: it lapses anyway)."""
        if self._claimed or self._target is None:
            return
        try:
            await self._ctx.pods.client(self.decode_pod).release(self._target.transfer_id, _RELEASE_TIMEOUT_S)
        except Exception as exc:
            logger.warning(
                "request %s: Release on %s failed (the reservation will lapse): %s",
                self.request_id,
                self.decode_pod.pod_id,
                exc,
            )
