"""The counts the router's admission decides on: where each Generate call is, and how fast calls move on.

Lifecycle of one call's `Ticket` (each step moves the counts; `leave` from any stage, once):
1. `enter(client_id)`: QUEUED, in the router (tokenizing, or in the wait queue); one of its client's streams.
2. `send(ticket, num_prompt_tokens)`: IN_FLIGHT, sent on to the pods and waiting for its first token.
3. `start(ticket)`: STREAMING, its first token came; it counts as drained (the drain rate is in calls per second).
4. `leave(ticket)`: LEFT, however it ended; no longer one of its client's streams.
Per process: every count here is this router process's own. Routers of several worker processes that share one
admission would share these counts (and only these: the waiters in the queue stay each process's own calls).
Everything runs on one event loop: no locks.
"""

from __future__ import annotations

import enum
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from pod.drain_rate import DrainRate


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
    """Calls queued in the router, in flight to the pods, streams per client, and the recent drain rate."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._num_queued = 0
        self._num_in_flight = 0
        self._num_in_flight_tokens = 0
        self._streams: Counter[str] = Counter()
        self._drain_rate = DrainRate(clock=clock)
        """Calls that got their first token lately."""

    @property
    def num_queued(self) -> int:
        """Calls in the router not yet sent on: tokenizing, or waiting in the queue."""
        return self._num_queued

    @property
    def num_in_flight(self) -> int:
        """Calls sent on to the pods, waiting for their first token."""
        return self._num_in_flight

    @property
    def num_in_flight_tokens(self) -> int:
        """The prompt tokens of the calls in flight."""
        return self._num_in_flight_tokens

    def num_streams(self, client_id: str) -> int:
        """The calls of `client_id` that have not ended, whatever their stage."""
        return self._streams[client_id]

    def seconds_to_drain(self, num_calls: int) -> float | None:
        """How long `num_calls` more first tokens take at the recent rate; None while none came lately."""
        return self._drain_rate.seconds_to_drain(num_calls)

    def enter(self, client_id: str) -> Ticket:
        self._num_queued += 1
        self._streams[client_id] += 1
        return Ticket(client_id)

    def send(self, ticket: Ticket, num_prompt_tokens: int) -> None:
        assert ticket.stage is Stage.QUEUED, ticket.stage
        self._num_queued -= 1
        self._num_in_flight += 1
        self._num_in_flight_tokens += num_prompt_tokens
        ticket.num_prompt_tokens = num_prompt_tokens
        ticket.stage = Stage.IN_FLIGHT

    def start(self, ticket: Ticket) -> None:
        """The call's first token came; a no-op unless it is in flight."""
        if ticket.stage is not Stage.IN_FLIGHT:
            return
        self._leave_flight(ticket)
        self._drain_rate.drained(1)
        ticket.stage = Stage.STREAMING

    def leave(self, ticket: Ticket) -> None:
        """The call ended; a no-op after the first time."""
        if ticket.stage is Stage.LEFT:
            return
        if ticket.stage is Stage.QUEUED:
            self._num_queued -= 1
        elif ticket.stage is Stage.IN_FLIGHT:
            self._leave_flight(ticket)
        ticket.stage = Stage.LEFT
        self._streams[ticket.client_id] -= 1
        if not self._streams[ticket.client_id]:
            del self._streams[ticket.client_id]

    def _leave_flight(self, ticket: Ticket) -> None:
        self._num_in_flight -= 1
        self._num_in_flight_tokens -= ticket.num_prompt_tokens
