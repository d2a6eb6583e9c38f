"""The router's admission control: which Generate calls are refused, which wait, and for how long.

Every call (gRPC and HTTP alike) goes through it, from the request lifecycle (router.completion.request_lifecycle):
1. `enter(client_id, timeout_s)` on arrival, before tokenizing: refused at once, UNAVAILABLE + RetryInfo of
   DRAIN_RETRY_S while the router drains; RESOURCE_EXHAUSTED + RetryInfo when its client holds
   `max_streams_per_client` streams, when `max_queued_requests` calls are already queued in the router (a bound on
   the memory they hold), or when the queue's predicted wait exceeds `max_queue_wait_s` or the call's own deadline
   (it could not be served in time). Otherwise the call is queued (router.admission.admission_state) and gets its
   ticket.
2. `admit(ticket, ...)` once tokenized: the call is sent on to the pods as soon as a live prefill and a live decode
   pod are known and the calls in flight (sent on, first token not yet back) leave room for it, per live prefill
   pod `max_waiting_requests_per_prefill_pod` calls and `max_queued_prompt_tokens_per_prefill_pod` prompt tokens.
   Until then it waits in the wait queue (router.admission.wait_queue), in arrival order, at most `max_queue_wait_s`
   (and its own deadline); past that it ends RESOURCE_EXHAUSTED + RetryInfo (UNAVAILABLE + RetryInfo while no pod of a
   role is live).
3. A completion already sent on that finds every decode pod out of KV blocks, or no live pod, waits in the same
   queue (`wait_for_room`, in its call's arrival order, so ahead of later calls) for capacity to return.
4. `start(ticket)` on its first token, `leave(ticket)` at its end, however it ends.
Capacity may return (the queue is woken) when the pod view reads the registry (`on_pods_refreshed`: new pods, more
free KV blocks), when a call gets its first token, and when one ends.
The limits are the whole router's, whatever `--workers N` is: the calls queued and in flight, their prompt tokens,
each client's streams and the drain rate are summed over the router's processes (router.admission.admission_state, over
the table they share, router.processes.shared_counts). The waiters stay each process's own: where the table has other
processes' rows, a process's queue also re-checks its head every CROSS_PROCESS_RECHECK_S while it has waiters, so that
room freed by another process's call (its first token, its end) reaches them within that. NOTE: a process checks for
room and claims it in one step of its event loop, but two processes may both see the last place and both take it:
for that moment a limit on the calls in flight may be passed by at most N - 1 calls (and the tokens by theirs).
The predicted wait is the first tokens that must come before a new call is sent on over the rate they came at in
the last DRAIN_WINDOW_S; it is known only once calls have waited for room throughout that window (a window with idle
time in it measures the load, not the capacity: after a quiet spell, a burst of a few dozen calls predicted minutes
from the handful that drained before it). While it is unknown (the queue backed up only lately, nothing drained, no
live pod) a new call is not refused for its predicted wait: it waits, bounded by `max_queue_wait_s`. RetryInfo
delays are the predicted wait within [MIN_RETRY_S, max_retry_s] (`max_retry_s` while it is unknown).
A client is the value of the call's `x-client-id` metadata key, else its peer address without the port.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from common.errors import PdserveError, ResourceExhaustedError, UnavailableError
from common.pod_registry import PodRole
from pod.drain_rate import DRAIN_WINDOW_S
from router.admission.admission_state import AdmissionState, Stage, Ticket
from router.admission.wait_queue import WaitQueue, WaitTimedOut
from router.config import RouterConfig
from router.processes.shared_counts import SharedCounts

CLIENT_ID_KEY = "x-client-id"
DRAIN_RETRY_S = 1.0
"""The RetryInfo delay of a call refused while the router drains (another router, or this one's successor, serves
the retry)."""
MIN_RETRY_S = 0.05
"""The shortest RetryInfo delay a refusal advertises."""
CROSS_PROCESS_RECHECK_S = 0.02
"""How often a router process with waiters re-checks the room other processes may have freed: at most a few sums
over the table's rows each time, and only while it has waiters."""
_ROLES: tuple[PodRole, ...] = ("prefill", "decode")


def client_id(metadata: Iterable[tuple[str, str | bytes]], peer: str) -> str:
    """The client of a call: its `x-client-id` metadata value, else `peer` ("ipv4:1.2.3.4:5678") without the port."""
    for key, value in metadata:
        if key == CLIENT_ID_KEY and value:
            return value if isinstance(value, str) else value.decode(errors="replace")
    host, _, port = peer.rpartition(":")
    return host if host and port.isdigit() else peer


class RouterAdmission:
    """Admission over this router's Generate calls (see the module docstring); `num_live_pods(role)` counts the live
    (not draining) pods of a role, `draining()` says whether the router drains, `counts` is the table of the router's
    processes (default: a table of this process alone)."""

    def __init__(
        self,
        config: RouterConfig,
        num_live_pods: Callable[[PodRole], int],
        draining: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
        counts: SharedCounts | None = None,
    ) -> None:
        self._config = config
        self._num_live_pods = num_live_pods
        self._draining = draining
        self._clock = clock
        counts = SharedCounts.local() if counts is None else counts
        self.state = AdmissionState(counts, clock)
        """The counts admission decides on: the whole router's."""
        # NOTE: alone in its table, every change of the counts is this process's own and wakes the queue itself.
        self._queue = WaitQueue(clock, CROSS_PROCESS_RECHECK_S if counts.num_rows > 1 else None)
        self._num_capacity_events = 0
        """Registry reads and calls ended so far: a waiter for room waits for the next one."""
        self._backlogged_since: float | None = None
        """Since when a new call would have had to wait for room (None: it would go on at once)."""

    @property
    def num_waiting(self) -> int:
        """Calls and completions waiting in the wait queue now."""
        return len(self._queue)

    def enter(self, client_id: str, timeout_s: float | None) -> Ticket:
        """The ticket of a new call, queued; raises UnavailableError or ResourceExhaustedError as the module
        docstring says. `timeout_s`: the time left to the call's deadline (None: none)."""
        if self._draining():
            raise UnavailableError("draining: this router takes no new calls", retry_after_s=DRAIN_RETRY_S)
        config, state = self._config, self.state
        wait_s = self.predicted_wait_s()
        num_streams, max_streams = state.num_streams(client_id), config.max_streams_per_client
        reason = None
        if max_streams and num_streams >= max_streams:
            reason = f"client {client_id!r} has {num_streams} streams open (limit {max_streams})"
        elif config.max_queued_requests and state.num_queued >= config.max_queued_requests:
            reason = f"{state.num_queued} requests queued in the router (limit {config.max_queued_requests})"
        elif wait_s is not None and wait_s > config.max_queue_wait_s:
            reason = f"the router's queue would take {wait_s:.1f} s (bound {config.max_queue_wait_s:g} s)"
        elif wait_s is not None and timeout_s is not None and wait_s > timeout_s:
            reason = f"the router's queue would take {wait_s:.1f} s, past the call's deadline in {timeout_s:.1f} s"
        if reason is not None:
            raise ResourceExhaustedError(f"overloaded: {reason}", retry_after_s=self._retry_after_s(wait_s))
        return state.enter(client_id)

    async def admit(self, ticket: Ticket, num_prompt_tokens: int, arrival: float, deadline: float | None) -> None:
        """Send the call on (its ticket in flight) once there is room, waiting in the queue until then (see the
        module docstring); `arrival` orders it, `deadline` (a clock time; None: none) bounds its wait as
        `max_queue_wait_s` does."""

        def take() -> bool:
            if not self._has_room(num_prompt_tokens):
                return False
            self.state.send(ticket, num_prompt_tokens)
            return True

        joined = self._clock()
        try:
            await self._queue.wait(arrival, self._wait_deadline(deadline), take)
        except WaitTimedOut:
            raise self._timed_out(self._clock() - joined) from None

    async def wait_for_room(self, arrival: float, deadline: float | None, has_room: Callable[[], bool]) -> None:
        """For a completion already sent on that found every decode pod full, or no live pod: wait in the queue, in
        the order of its call's `arrival`, until the pods were read again or a call ended since, and `has_room()`.
        Raises WaitTimedOut at `deadline` or after `max_queue_wait_s`, whichever comes first."""
        seen = self._num_capacity_events

        def take() -> bool:
            return self._num_capacity_events > seen and has_room()

        await self._queue.wait(arrival, self._wait_deadline(deadline), take)

    def start(self, ticket: Ticket) -> None:
        """The call got its first token (a no-op after the first): its place in flight is free."""
        if ticket.stage is Stage.IN_FLIGHT:
            self.state.start(ticket)
            self._queue.wake()

    def leave(self, ticket: Ticket) -> None:
        """The call ended, however (a no-op after the first)."""
        if ticket.stage is not Stage.LEFT:
            self.state.leave(ticket)
            self._capacity_may_have_returned()

    def on_pods_refreshed(self) -> None:
        """The pod view read the registry: pods may have come, or freed KV blocks."""
        self._capacity_may_have_returned()

    def predicted_wait_s(self) -> float | None:
        """How long a call arriving now would wait to be sent on: 0 while there is room in flight, else the first
        tokens due before it over their recent rate; None while that rate is unknown (calls have not waited for
        room throughout the last DRAIN_WINDOW_S, or nothing drained) or no pod is live."""
        if not self._pods_live():
            return None
        state = self.state
        limit = self._config.max_waiting_requests_per_prefill_pod * self._num_live_pods("prefill")
        num_ahead = state.num_in_flight + state.num_queued + 1 - limit if limit else 0
        now = self._clock()
        if num_ahead <= 0:
            self._backlogged_since = None
            return 0.0
        if self._backlogged_since is None:
            self._backlogged_since = now
        if now - self._backlogged_since < DRAIN_WINDOW_S:
            return None
        return state.seconds_to_drain(num_ahead)

    def retry_after_s(self) -> float:
        """The RetryInfo delay of a refusal now: the predicted wait within [MIN_RETRY_S, max_retry_s]."""
        return self._retry_after_s(self.predicted_wait_s())

    def _retry_after_s(self, wait_s: float | None) -> float:
        if wait_s is None:
            return self._config.max_retry_s
        return min(max(wait_s, MIN_RETRY_S), self._config.max_retry_s)

    def _has_room(self, num_prompt_tokens: int) -> bool:
        """Whether a call of `num_prompt_tokens` may be sent on now."""
        if not self._pods_live():
            return False
        num_prefill_pods = self._num_live_pods("prefill")
        state, config = self.state, self._config
        max_calls = config.max_waiting_requests_per_prefill_pod * num_prefill_pods
        if max_calls and state.num_in_flight >= max_calls:
            return False
        max_tokens = config.max_queued_prompt_tokens_per_prefill_pod * num_prefill_pods
        # NOTE: a prompt over the token limit still goes when nothing is in flight, so that no prompt waits forever.
        return not (max_tokens and state.num_in_flight and state.num_in_flight_tokens + num_prompt_tokens > max_tokens)

    def _pods_live(self) -> bool:
        return all(self._num_live_pods(role) for role in _ROLES)

    def _wait_deadline(self, deadline: float | None) -> float:
        bound = self._clock() + self._config.max_queue_wait_s
        return bound if deadline is None else min(bound, deadline)

    def _timed_out(self, waited_s: float) -> PdserveError:
        for role in _ROLES:
            if not self._num_live_pods(role):
                message = f"no {role} pod is available (waited {waited_s:.1f} s)"
                return UnavailableError(message, retry_after_s=self._config.max_retry_s)
        return ResourceExhaustedError(
            f"overloaded: waited {waited_s:.1f} s in the router's queue (bound {self._config.max_queue_wait_s:g} s)",
            retry_after_s=self.retry_after_s(),
        )

    def _capacity_may_have_returned(self) -> None:
        self._num_capacity_events += 1
        self._queue.wake()
