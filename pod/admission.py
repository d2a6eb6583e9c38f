"""Admission control: how much work a service lets wait, and what it tells a caller it turns away.

Lifecycle of one request through an `Admission`:
1. `admit(client_id, num_prompt_tokens)` on arrival (`check` alone, earlier, refuses as early as it can) checks three
   limits (0 turns one off): requests waiting,
   prompt tokens waiting, and streams open for this client. Beyond any of them it raises ResourceExhaustedError
   at once, its `retry_after_s` the time the queue needs to drain at the rate it drained lately, bounded by
   [min_retry_s, max_retry_s]. Otherwise the request is counted as waiting and as one of its client's streams.
2. `start(ticket)` when the request leaves the queue (a prefill pod computed its first token, a decode pod's
   reservation was claimed by Decode, the router got its first token): its prompt tokens count as drained.
3. `finish(ticket)` when it ends, however (starting it first if it never was).
A service that refuses before it knows the prompt (the router's door) may `hold` a place in the queue for a call it
lets in, until the call is admitted (`release_hold` first) or ends: a held place counts as a waiting request.
A prompt longer than the token limit is still admitted when nothing waits, so that no prompt is refused forever.
Everything runs on one event loop: no locks.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from common.errors import ResourceExhaustedError

DRAIN_WINDOW_S = 10.0
"""How far back the drain rate looks."""


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    """Limits of one service (0: no limit) and the bounds of the retry delay it advertises."""

    max_waiting_requests: int = 0
    max_queued_prompt_tokens: int = 0
    max_streams_per_client: int = 0
    min_retry_s: float = 0.05
    max_retry_s: float = 5.0

    def scaled(self, factor: int) -> AdmissionLimits:
        """The queue limits times `factor` (e.g. per prefill pod, times the pods); the per-client limit as it is."""
        return AdmissionLimits(
            self.max_waiting_requests * factor,
            self.max_queued_prompt_tokens * factor,
            self.max_streams_per_client,
            self.min_retry_s,
            self.max_retry_s,
        )


@dataclass(slots=True, eq=False)
class Ticket:
    """One admitted request."""

    client_id: str
    num_prompt_tokens: int
    started: bool = False
    finished: bool = False


class Admission:
    """The waiting requests and open streams of one service, checked against `limits`."""

    def __init__(self, limits: AdmissionLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._num_waiting = 0
        self._num_held = 0
        self._num_queued_tokens = 0
        self._streams: Counter[str] = Counter()
        self._drained: deque[tuple[float, int]] = deque()  # (when, prompt tokens) of recent starts

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    @property
    def num_queued_prompt_tokens(self) -> int:
        return self._num_queued_tokens

    def num_streams(self, client_id: str) -> int:
        return self._streams[client_id]

    @property
    def num_held(self) -> int:
        return self._num_held

    def check(
        self,
        client_id: str | None,
        num_prompt_tokens: int = 0,
        limits: AdmissionLimits | None = None,
        holds_place: bool = False,
    ) -> None:
        """Raise ResourceExhaustedError if `admit` would now (e.g. before the prompt is tokenized: 0 tokens, so
        only a queue already over its token limit refuses; `client_id` None: any client, its limit unchecked);
        `limits` overrides the service's own for this call; `holds_place`: the caller holds one of the held places,
        which its own check does not count."""
        reason = self._over_limit(client_id, num_prompt_tokens, limits or self.limits, self._num_held - holds_place)
        if reason is not None:
            raise ResourceExhaustedError(f"overloaded: {reason}", retry_after_s=self.retry_after_s(limits))

    def hold(self, limits: AdmissionLimits | None = None) -> None:
        """Hold a place in the queue for a call whose prompt is not known yet, or raise ResourceExhaustedError as
        `check` does for any client."""
        self.check(None, 0, limits)
        self._num_held += 1

    def release_hold(self) -> None:
        """Give a place `hold` took back (its call was admitted, or ended before)."""
        self._num_held -= 1

    def admit(self, client_id: str, num_prompt_tokens: int, limits: AdmissionLimits | None = None) -> Ticket:
        """Count the request in, or raise ResourceExhaustedError (see the module docstring)."""
        self.check(client_id, num_prompt_tokens, limits)
        self._num_waiting += 1
        self._num_queued_tokens += num_prompt_tokens
        self._streams[client_id] += 1
        return Ticket(client_id, num_prompt_tokens)

    def start(self, ticket: Ticket) -> None:
        """The request left the queue; a no-op after the first call."""
        if ticket.started:
            return
        ticket.started = True
        self._num_waiting -= 1
        self._num_queued_tokens -= ticket.num_prompt_tokens
        self._drained.append((self._clock(), ticket.num_prompt_tokens))

    def finish(self, ticket: Ticket) -> None:
        """The request ended; a no-op after the first call."""
        if ticket.finished:
            return
        self.start(ticket)
        ticket.finished = True
        self._streams[ticket.client_id] -= 1
        if not self._streams[ticket.client_id]:
            del self._streams[ticket.client_id]

    def retry_after_s(self, limits: AdmissionLimits | None = None) -> float:
        """How long the waiting prompt tokens take to drain at the recent rate, within the limits' bounds (the upper
        bound while nothing drained in the last DRAIN_WINDOW_S)."""
        limits = limits or self.limits
        now = self._clock()
        while self._drained and self._drained[0][0] < now - DRAIN_WINDOW_S:
            self._drained.popleft()
        if not self._drained:
            return limits.max_retry_s
        num_tokens = sum(n for _, n in self._drained)
        # NOTE: the rate over the span the window covers so far (at least 1 s), not the whole window, so that a
        # queue that only began draining a moment ago is not taken for a slow one.
        span_s = max(now - self._drained[0][0], 1.0)
        drain_s = self._num_queued_tokens * span_s / max(num_tokens, 1)
        return min(max(drain_s, limits.min_retry_s), limits.max_retry_s)

    def _over_limit(
        self, client_id: str | None, num_prompt_tokens: int, limits: AdmissionLimits, num_held: int
    ) -> str | None:
        num_waiting = self._num_waiting + num_held
        if limits.max_waiting_requests and num_waiting >= limits.max_waiting_requests:
            return f"{num_waiting} requests waiting (limit {limits.max_waiting_requests})"
        queued = self._num_queued_tokens + num_prompt_tokens
        if limits.max_queued_prompt_tokens and self._num_waiting and queued > limits.max_queued_prompt_tokens:
            return f"{queued} prompt tokens would wait (limit {limits.max_queued_prompt_tokens})"
        if client_id is None or not limits.max_streams_per_client:
            return None
        if self._streams[client_id] >= limits.max_streams_per_client:
            return f"client {client_id!r} has {self._streams[client_id]} streams open " \
                   f"(limit {limits.max_streams_per_client})"  # fmt: skip
        return None
