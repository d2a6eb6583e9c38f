"""The router's admission control: how many Generate calls may wait for a first token, and per client.

A gRPC call is checked at the door (`enter`, by router.admission_interceptor before the call is even parsed: is the
router draining, is its queue full) and, let in, holds a place in the queue (a `DoorPass`, in the call's context:
DOOR_PASS) until it is admitted, so that a burst of calls fills the queue at the door and the rest are refused
there, at once, instead of after tokenizing. Every call (HTTP ones too) is checked again on arrival in the lifecycle
(`check`: the same, plus the client's streams, so that a refusal costs no tokenizing), and admitted once its prompt
is tokenized, before any pod is asked for anything (`gate`: the pass is given back as the call is counted in):
0. while the router drains, every new call ends UNAVAILABLE with a RetryInfo of DRAIN_RETRY_S;
1. the limits of RouterConfig apply, the queue limits per live prefill pod (a cluster with more prefill pods
   drains faster): requests waiting for their first token, their prompt tokens, and streams per client;
   beyond any, the call ends RESOURCE_EXHAUSTED with a RetryInfo of the queue's drain time (pod.admission);
2. its first chunk (the first token) takes it out of the queue;
3. the stream's end, however it ends, closes its client's stream.
A client is the value of the call's `x-client-id` metadata key, else its peer address without the port.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable, Iterable
from contextlib import aclosing
from contextvars import ContextVar
from typing import TypeVar

from common.errors import UnavailableError
from pod.admission import Admission, AdmissionLimits
from router.config import RouterConfig

CLIENT_ID_KEY = "x-client-id"
DRAIN_RETRY_S = 1.0
"""The RetryInfo delay of a call refused while the router drains (another router, or this one's successor, serves
the retry)."""
T = TypeVar("T")


class DoorPass:
    """The place in the queue a call let in at the door holds until it is admitted or ends (`release`, idempotent)."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self._admission.release_hold()


DOOR_PASS: ContextVar[DoorPass | None] = ContextVar("door_pass", default=None)
"""The pass of the call being served, set by the door (router.admission_interceptor) around its handler."""


def client_id(metadata: Iterable[tuple[str, str | bytes]], peer: str) -> str:
    """The client of a call: its `x-client-id` metadata value, else `peer` ("ipv4:1.2.3.4:5678") without the port."""
    for key, value in metadata:
        if key == CLIENT_ID_KEY and value:
            return value if isinstance(value, str) else value.decode(errors="replace")
    host, _, port = peer.rpartition(":")
    return host if host and port.isdigit() else peer


class RouterAdmission:
    """Admission over this router's Generate calls; `num_prefill_pods()` counts the live prefill pods, `draining()`
    says whether the router drains."""

    def __init__(
        self,
        config: RouterConfig,
        num_prefill_pods: Callable[[], int],
        draining: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._per_pod = AdmissionLimits(
            config.max_waiting_requests_per_prefill_pod,
            config.max_queued_prompt_tokens_per_prefill_pod,
            config.max_streams_per_client,
            max_retry_s=config.max_retry_s,
        )
        self._num_prefill_pods = num_prefill_pods
        self._draining = draining
        self.admission = Admission(self._per_pod, clock)

    def limits(self) -> AdmissionLimits:
        """The limits now: the queue limits times the live prefill pods (at least one)."""
        return self._per_pod.scaled(max(self._num_prefill_pods(), 1))

    def enter(self) -> DoorPass:
        """A place in the queue for a new call, whoever sent it and whatever its prompt; UnavailableError while the
        router drains, ResourceExhaustedError while the queue (waiting calls and held places) is full."""
        self._check_draining()
        self.admission.hold(self.limits())
        return DoorPass(self.admission)

    def filling(self) -> bool:
        """Whether a quarter of the queue's places or more are taken (waiting calls and held places)."""
        limit = self.limits().max_waiting_requests
        return bool(limit) and self.admission.num_waiting + self.admission.num_held >= limit / 4

    def check(self, client: str | None) -> None:
        """As `enter` (not counting the calling call's own pass), and ResourceExhaustedError if `client` holds as
        many streams as it may."""
        self._check_draining()
        door_pass = DOOR_PASS.get()
        self.admission.check(client, 0, self.limits(), holds_place=door_pass is not None and door_pass.held)

    async def gate(
        self, chunks: AsyncGenerator[T, None], client: str, num_prompt_tokens: int
    ) -> AsyncGenerator[T, None]:
        """`chunks`, admitted first (ResourceExhaustedError before any is asked for), counted as waiting until the
        first one arrives and as one of `client`'s streams until the end; the call's door pass is given back first."""
        door_pass = DOOR_PASS.get()
        if door_pass is not None:
            door_pass.release()
        ticket = self.admission.admit(client, num_prompt_tokens, self.limits())
        try:
            async with aclosing(chunks) as admitted:
                async for chunk in admitted:
                    self.admission.start(ticket)
                    yield chunk
        finally:
            self.admission.finish(ticket)

    def _check_draining(self) -> None:
        if self._draining():
            raise UnavailableError("draining: this router takes no new calls", retry_after_s=DRAIN_RETRY_S)
