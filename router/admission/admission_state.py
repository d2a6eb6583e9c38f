"""The counts the router's admission decides on: where each Generate call is, and how fast calls move on.

Lifecycle of one call's `Ticket` (each step moves the counts; `leave` from any stage, once):
1. `enter(client_id)`: QUEUED, in the router (tokenizing, or in the wait queue); one of its client's streams.
2. `send(ticket, num_prompt_tokens)`: IN_FLIGHT, sent on to the pods and waiting for its first token.
3. `start(ticket)`: STREAMING, its first token came; it counts as drained (the drain rate is in calls per second).
4. `leave(ticket)`: LEFT, however it ended; no longer one of its client's streams.
The whole router's: the counts live in the table its processes share (router.processes.shared_counts). Each process
writes its own row as its own tickets move, and every count read here is the sum over the rows, so that an admission
limit means the same whatever `--workers N` is (a lone router has a table of one row: the same code). The tickets
themselves (a call's stage and prompt tokens) are the process's own, as are the waiters in its queue
(router.admission.wait_queue). The drain rate is the whole router's too: the predicted wait divides the whole router's
calls ahead by the rate at which first tokens came, and a process alone sees 1/N of them. Each process counts its first
tokens in its row's ring of one-second buckets (`SharedCounts.add_drained`); the rate is what every row drained within
the last DRAIN_WINDOW_S over the span since the earliest of it, at least MIN_SPAN_S (as pod.drain_rate.DrainRate, by
whole seconds). A ring of counters in the row needs no lock and no reader's history, forgets a second by itself when its
bucket comes round again, and goes with a dead worker's row when the supervisor zeroes it; a decayed rate would need
a float and its time written as one (two slots could be read torn) and is slow to trust a queue that just began.
Everything in a process runs on one event loop: no locks.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass

from pod.drain_rate import MIN_SPAN_S
from router.processes.shared_counts import SharedCounts, Total


class Stage(enum.Enum):
    QUEUED = "queued"
    IN_FLIGHT = "in flight"
    STREAMING = "streaming"
    LEFT = "left"


@dataclass(slots=True, eq=False)
class Ticket:
    """One Generate call, from its arrival to its end."""

    client_id: str
    stage: Stage = Stage.QUEUED
    num_prompt_tokens: int = 0
    """Its prompt tokens (times its completions), counted while it is in flight."""


class AdmissionState:
    """Calls queued in the router, in flight to the pods, streams per client, and the recent drain rate, summed over
    the router's processes in `counts` (default: a table of this process alone)."""

    def __init__(self, counts: SharedCounts | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._counts = SharedCounts.local() if counts is None else counts
        self._clock = clock

    @property
    def num_queued(self) -> int:
        """Calls in the router not yet sent on: tokenizing, or waiting in the queue."""
        return self._counts.total(Total.QUEUED_REQUESTS)

    @property
    def num_in_flight(self) -> int:
        """Calls sent on to the pods, waiting for their first token."""
        return self._counts.total(Total.IN_FLIGHT_REQUESTS)

    @property
    def num_in_flight_tokens(self) -> int:
        """The prompt tokens of the calls in flight."""
        return self._counts.total(Total.IN_FLIGHT_PROMPT_TOKENS)

    def num_streams(self, client_id: str) -> int:
        """The calls of `client_id` that have not ended, whatever their stage (and those of any client sharing its
        bucket: router.processes.shared_counts)."""
        return self._counts.client_streams(client_id)

    def seconds_to_drain(self, num_calls: int) -> float | None:
        """How long `num_calls` more first tokens take at the recent rate; None while none came lately."""
        now = self._clock()
        num_drained, earliest = self._counts.drained(now)
        if not num_drained:
            return None
        # NOTE: the rate over the span the window covers so far (at least MIN_SPAN_S), not the whole window, so that a
        # router that only began serving a moment ago is not taken for a slow one.
        return num_calls * max(now - earliest, MIN_SPAN_S) / num_drained

    def enter(self, client_id: str) -> Ticket:
        self._counts.add(Total.QUEUED_REQUESTS, 1)
        self._counts.add_client_streams(client_id, 1)
        return Ticket(client_id)

    def send(self, ticket: Ticket, num_prompt_tokens: int) -> None:
        assert ticket.stage is Stage.QUEUED, ticket.stage
        self._counts.add(Total.QUEUED_REQUESTS, -1)
        self._counts.add(Total.IN_FLIGHT_REQUESTS, 1)
        self._counts.add(Total.IN_FLIGHT_PROMPT_TOKENS, num_prompt_tokens)
        ticket.num_prompt_tokens = num_prompt_tokens
        ticket.stage = Stage.IN_FLIGHT

    def start(self, ticket: Ticket) -> None:
        """The call's first token came; a no-op unless it is in flight."""
        if ticket.stage is not Stage.IN_FLIGHT:
            return
        self._leave_flight(ticket)
        self._counts.add_drained(self._clock(), 1)
        ticket.stage = Stage.STREAMING

    def leave(self, ticket: Ticket) -> None:
        """The call ended; a no-op after the first time."""
        if ticket.stage is Stage.LEFT:
            return
        if ticket.stage is Stage.QUEUED:
            self._counts.add(Total.QUEUED_REQUESTS, -1)
        elif ticket.stage is Stage.IN_FLIGHT:
            self._leave_flight(ticket)
        ticket.stage = Stage.LEFT
        self._counts.add_client_streams(ticket.client_id, -1)

    def _leave_flight(self, ticket: Ticket) -> None:
        self._counts.add(Total.IN_FLIGHT_REQUESTS, -1)
        self._counts.add(Total.IN_FLIGHT_PROMPT_TOKENS, -ticket.num_prompt_tokens)
