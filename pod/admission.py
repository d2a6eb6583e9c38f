"""Admission control: how much work a service lets wait, and what it tells a caller it turns away.

Lifecycle of one request through an `Admission`:
1. `admit(client_id, num_prompt_tokens)` on arrival (`check` alone, earlier, refuses as early as it can) checks three
   limits (0 turns one off): requests waiting,
   prompt tokens waiting, and streams open for this client. Beyond any of them it raises ResourceExhaustedError
   at once, its `retry_after_s` the time the queue needs to drain at the rate it drained lately, bounded by
   [min_retry_s, max_retry_s]. Otherwise the request is counted as waiting and as one of its client's streams.
2. `start(ticket)` when the request leaves the queue (a prefill pod computed its first token, a decode pod's
   reservation was claimed by Decode): its prompt tokens count as drained.
3. `finish(ticket)` when it ends, however (starting it first if it never was).
A prompt longer than the token limit is still admitted when nothing waits, so that no prompt is refused forever.
Everything runs on one event loop: no locks.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from common.errors import ResourceExhaustedError
from pod.drain_rate import DrainRate


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    """Limits of one service (0: no limit) and the bounds of the retry delay it advertises."""

    max_waiting_requests: int = 0
    max_queued_prompt_tokens: int = 0
    max_streams_per_client: int = 0
    min_retry_s: float = 0.05
    max_retry_s: float = 5.0


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
        self._num_waiting = 0
        self._num_queued_tokens = 0
        self._streams: Counter[str] = Counter()
        self._drain_rate = DrainRate(clock=clock)
        """Prompt tokens of the requests that started lately."""

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    @property
    def num_queued_prompt_tokens(self) -> int:
        return self._num_queued_tokens

    def num_streams(self, client_id: str) -> int:
        return self._streams[client_id]

    def check(self, client_id: str, num_prompt_tokens: int = 0) -> None:
        """Raise ResourceExhaustedError if `admit` would now (e.g. before the prompt is tokenized: 0 tokens, so
        only a queue already over its token limit refuses)."""
        reason = self._over_limit(client_id, num_prompt_tokens)
        if reason is not None:
            raise ResourceExhaustedError(f"overloaded: {reason}", retry_after_s=self.retry_after_s())

    def admit(self, client_id: str, num_prompt_tokens: int) -> Ticket:
        """Count the request in, or raise ResourceExhaustedError (see the module docstring)."""
        self.check(client_id, num_prompt_tokens)
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
        self._drain_rate.drained(ticket.num_prompt_tokens)

    def finish(self, ticket: Ticket) -> None:
        """The request ended; a no-op after the first call."""
        if ticket.finished:
            return
        self.start(ticket)
        ticket.finished = True
        self._streams[ticket.client_id] -= 1
        if not self._streams[ticket.client_id]:
            del self._streams[ticket.client_id]

    def retry_after_s(self) -> float:
        """How long the waiting prompt tokens take to drain at the recent rate, within the limits' bounds (the upper
        bound while nothing drained in the last pod.drain_rate.DRAIN_WINDOW_S)."""
        limits = self.limits
        drain_s = self._drain_rate.seconds_to_drain(self._num_queued_tokens)
        if drain_s is None:
            return limits.max_retry_s
        return min(max(drain_s, limits.min_retry_s), limits.max_retry_s)

    def _over_limit(self, client_id: str, num_prompt_tokens: int) -> str | None:
        limits = self.limits
        if limits.max_waiting_requests and self._num_waiting >= limits.max_waiting_requests:
            return f"{self._num_waiting} requests waiting (limit {limits.max_waiting_requests})"
        queued = self._num_queued_tokens + num_prompt_tokens
        if limits.max_queued_prompt_tokens and self._num_waiting and queued > limits.max_queued_prompt_tokens:
            return f"{queued} prompt tokens would wait (limit {limits.max_queued_prompt_tokens})"
        num_streams, limit = self._streams[client_id], limits.max_streams_per_client
        if limit and num_streams >= limit:
            return f"client {client_id!r} has {num_streams} streams open (limit {limit})"
        return None
